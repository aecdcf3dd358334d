package health

import (
	"context"
	"errors"
)

// Conn is the sampler's dedicated connection to PostgreSQL, opened by [Options.Connect]
// (package pgxconn opens one with pgx). The sampler uses it from one round at a time, never
// concurrently, and bounds every call's ctx.
//
// The sampler describes a failed call by what its error carries, never by its text, which for
// a server error can quote literals of the query:
//   - a [ResultError]: the query ran, but its result is not one number;
//   - a SQLState() string method in the error's chain (as *pgconn.PgError has): the server
//     refused the statement, and the SQLSTATE names why;
//   - [ErrTimeout] or [context.DeadlineExceeded] (errors.Is): the call did not complete in time.
//
// Any other error is described by its text. Errors of Options.Connect are described the same
// way.
type Conn interface {
	// Exec runs sql with args, which are bound as parameters, and discards its result.
	Exec(ctx context.Context, sql string, args ...any) error
	// ReadNumber runs sql, which must return one row of one numeric column, and returns that
	// number: no row is [ErrNoRows], a NULL is [ErrNull], and NaN, which compares false with
	// every threshold, is a ResultError.
	ReadNumber(ctx context.Context, sql string) (float64, error)
	// IsClosed reports whether the connection is closed, by Close or because a call broke it
	// (a client-side timeout, a terminated backend): the sampler then opens another.
	IsClosed() bool
	// Close closes the connection.
	Close(ctx context.Context) error
}

// ResultError reports a health query whose result is not one row holding one number. Problem
// says how, as the sampler publishes it ("returned 2 columns, want one number"); it never
// quotes a value of the result.
type ResultError struct{ Problem string }

func (e ResultError) Error() string { return "health: the query " + e.Problem }

var (
	// ErrNoRows is the ResultError of a query that returned no row.
	ErrNoRows error = ResultError{"returned no rows, want one row with one number"}
	// ErrNull is the ResultError of a query that returned NULL.
	ErrNull error = ResultError{"returned NULL, want a number"}
	// ErrTimeout marks (errors.Is) the error of a [Conn] call that timed out on the client side.
	ErrTimeout = errors.New("health: timed out")
)
