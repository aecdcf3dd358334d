package driver

import (
	"context"
	"database/sql/driver"
	"errors"

	"github.com/jackc/pgerrcode"
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
// passed (its cause) and err is a cancelled statement's (cancelled). Another error read after
// the bound is the statement's own: the server's, or a row the application cannot scan, from a
// result that had all arrived, which the bound did not cut.
func overran(qctx context.Context, err error) error {
	if err == nil || !cancelled(err) {
		return err
	}
	if cause, ok := context.Cause(qctx).(*engine.OverrunCause); ok {
		return &overrunError{cause: cause, err: err}
	}
	return err
}

// cancelled reports whether err is what pgx answers for a statement its context's deadline
// ended: the context's error (pgx's, before the statement was sent or while it waited on the
// server), the server's query_canceled (pgx's cancel request), or from pgx's stdlib a bad
// connection (a statement its context ended before it was sent).
func cancelled(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, driver.ErrBadConn) ||
		errors.As(err, &pgErr) && pgErr.Code == pgerrcode.QueryCanceled
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
