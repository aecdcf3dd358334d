package driver

import (
	"context"
	"database/sql/driver"
	"errors"

	"github.com/pgtraffic/pgtraffic/internal/engine"
)

// overrunContext returns the context a statement admitted into x runs under, its rows
// included: ctx with a deadline at the budget's max_duration after the statement's start and
// ErrOverrun as its cause, and the func that releases it once the statement is finished. With
// no max_duration it returns ctx and nil: no timer.
func overrunContext(ctx context.Context, x *engine.Exec) (context.Context, context.CancelFunc) {
	if x.MaxDuration <= 0 {
		return ctx, nil
	}
	return context.WithDeadlineCause(ctx, x.Start().Add(x.MaxDuration), ErrOverrun)
}

// batchOverrunContext is overrunContext for an admitted batch: ctx bounded by the batch's
// smallest max_duration (engine.Batch.Deadline), its results included.
func batchOverrunContext(ctx context.Context, b *engine.Batch) (context.Context, context.CancelFunc) {
	d, ok := b.Deadline()
	if !ok {
		return ctx, nil
	}
	return context.WithDeadlineCause(ctx, d, ErrOverrun)
}

// overran returns err, the error of a statement run under qctx (from overrunContext), as an
// error that also matches ErrOverrun when qctx's max_duration is what ended it.
func overran(qctx context.Context, err error) error {
	if err == nil || context.Cause(qctx) != ErrOverrun {
		return err
	}
	return &overrunError{err: err}
}

// overrunError is the error of a statement cancelled past its budget's max_duration. It
// matches ErrOverrun and context.DeadlineExceeded, and wraps pgx's error. Its message is pgx's,
// which names no SQL.
//
// Except driver.ErrBadConn: pgx's stdlib reports a statement whose context ended before
// anything was sent as a bad connection, which database/sql retries on another connection. The
// deadline was pgtraffic's, and the connection is sound: the statement must not run again, nor
// its connection be closed. Such an error wraps pgx's only by its message.
type overrunError struct{ err error }

func (e *overrunError) Error() string { return ErrOverrun.Error() + ": " + e.err.Error() }

func (e *overrunError) Unwrap() []error {
	if errors.Is(e.err, driver.ErrBadConn) {
		return []error{ErrOverrun, context.DeadlineExceeded}
	}
	return []error{ErrOverrun, context.DeadlineExceeded, e.err}
}
