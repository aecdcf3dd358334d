package driver

import (
	"context"
	"database/sql/driver"
	"errors"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtraffic/pgtraffic/internal/engine"
)

// overrunContext returns the context an admitted job j runs under, its rows (or a batch's
// results) included: ctx with a deadline at its budgets' smallest max_duration after its start
// and the bound's cause (engine.Exec.Overrun: it matches ErrOverrun and names the budget and
// the bound), and the func that releases it once the job is finished. With no max_duration it
// returns ctx and nil: no timer.
func overrunContext(ctx context.Context, j job) (context.Context, context.CancelFunc) {
	d, cause, ok := j.Deadline()
	if !ok {
		return ctx, nil
	}
	return context.WithDeadlineCause(ctx, d, cause)
}

// overran returns err, the error of a statement run under qctx (from overrunContext), as an
// error that also matches ErrOverrun when qctx's max_duration is what ended it: qctx's bound
// passed (its cause) and err is not the statement's own (own). The statement's own error read
// after the bound (the server's, or a row the application cannot scan, from a result that had
// all arrived) is not an overrun: the bound cut nothing.
func overran(qctx context.Context, err error) error {
	if err == nil || own(err) {
		return err
	}
	if cause, ok := context.Cause(qctx).(*engine.OverrunCause); ok {
		return &overrunError{cause: cause, err: err}
	}
	return err
}

// own reports whether err is a statement's own error, whatever its timing: the server's (but
// query_canceled, which pgx's cancel request causes), or a value pgx could not scan. What a
// cancellation leaves besides (the context's error, a connection pgx closed under a statement
// that did not stop, a bad connection of pgx's stdlib) is not.
func own(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code != pgerrcode.QueryCanceled
	}
	var scanErr pgx.ScanArgError
	return errors.As(err, &scanErr)
}

// overrunError is the error of a statement cancelled past its budget's max_duration. It
// matches ErrOverrun and context.DeadlineExceeded, and wraps pgx's error. Its message is the
// cause's, which names the budget and the bound, then pgx's, which names no SQL.
//
// Except driver.ErrBadConn: pgx's stdlib reports a statement whose context ended before
// anything was sent as a bad connection, which database/sql retries on another connection. The
// deadline was pgtraffic's, and the connection is sound: the statement must not run again, nor
// its connection be closed. Such an error wraps pgx's only by its message.
type overrunError struct {
	cause *engine.OverrunCause
	err   error
}

func (e *overrunError) Error() string { return e.cause.Error() + ": " + e.err.Error() }

func (e *overrunError) Unwrap() []error {
	if errors.Is(e.err, driver.ErrBadConn) {
		return []error{e.cause, context.DeadlineExceeded}
	}
	return []error{e.cause, context.DeadlineExceeded, e.err}
}
