package driver

import (
	"context"
	"errors"
	"runtime"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// pgxRows are the rows of a pgx-native query: pgx's rows, whose statement is finished, and whose
// pool connection is released, once, when they end: read to the end (Next returns false, which
// closes pgx's rows), closed, or when Scan or Values fails (which closes pgx's rows too), as
// pgxpool's rows end. A panic in pgx's Next or Close ends them too. Like pgx's rows they are
// used by one goroutine.
//
// Rows never closed would hold their statement's slots for good, as in the database/sql driver
// (leak.go), and pgxpool sets no finalizer either: so the rows of a Query carry a cleanup that,
// once they are garbage, ends the statement as Close would (counted in pgtraffic.rows.leaked,
// with a warning). Ending it releases a pool connection too, which pgxpool destroys as it is
// still busy, so the pool gets its capacity back; in a transaction the connection stays the
// transaction's. The cleanup's argument is the openStmt, which must not point to the rows.
type pgxRows struct {
	pgx.Rows
	// qctx is what the rows ran under (overrunContext): kept past their end, for Err.
	qctx context.Context
	open *openStmt
}

var _ pgx.Rows = (*pgxRows)(nil)

// newPgxRows returns the storage of a Query's rows, with the leak cleanup attached.
func newPgxRows(lk *leaks) *pgxRows {
	w := &pgxRows{open: &openStmt{leaks: lk}}
	runtime.AddCleanup(w, reclaimPgx, w.open)
	return w
}

// end finishes the statement with err and releases its connection, the first time only.
func (r *pgxRows) end(err error) { r.open.finish(err) }

// Err is the rows' error, matching ErrOverrun when max_duration cancelled them.
func (r *pgxRows) Err() error { return overran(r.qctx, r.Rows.Err()) }

func (r *pgxRows) Next() (more bool) {
	done := false
	defer func() {
		if !done {
			r.end(errPanicked)
		} else if !more {
			r.end(r.Err())
		}
	}()
	more = r.Rows.Next()
	done = true
	return more
}

// Scan is pgx's Scan. A failed Scan closes pgx's rows, and ends the statement with its error
// as pgxpool's rows give their connection back then: a caller that returns the error without
// closing the rows leaks nothing.
func (r *pgxRows) Scan(dest ...any) error {
	err := r.Rows.Scan(dest...)
	if err != nil {
		r.Close()
	}
	return err
}

// Values is pgx's Values; a failure ends the statement, as a failed Scan does.
func (r *pgxRows) Values() ([]any, error) {
	values, err := r.Rows.Values()
	if err != nil {
		r.Close()
	}
	return values, err
}

// Close closes pgx's rows and ends the statement. Once the rows ended it does nothing: pgx's
// rows are closed (or their Next panicked), and their connection may be another statement's.
func (r *pgxRows) Close() {
	if !r.open.inFlight() {
		return
	}
	done := false
	defer func() {
		if !done {
			r.end(errPanicked)
		} else {
			r.end(r.Err())
		}
	}()
	r.Rows.Close()
	done = true
}

// pgxRow is the row of a QueryRow: pgx's own row, sent on the statement's connection under
// its max_duration context, whose Scan also ends the statement, once: finishes it, gives its
// pool connection back, stops its timer. As pgx's row, it must be scanned: until then the
// statement holds its budgets' slots and its connection, and unlike a Query's rows it has no
// cleanup to give them back (a cleanup is an allocation per row, which the rows' slabs exist to
// spare: ticket.row). The row of a
// statement that was not sent (refused, or no connection) returns why from Scan. Like pgx's
// row it is used by one goroutine.
type pgxRow struct {
	row  pgx.Row // pgx's; nil when err is set
	err  error   // why nothing was sent: a *BlockedError, or the pool's Acquire error
	open openStmt
}

var _ pgx.Row = (*pgxRow)(nil)

// Scan is pgx's Scan: the first row into dest, pgx.ErrNoRows when there is none, the query's
// error when it failed (matching ErrOverrun when max_duration cancelled it). pgx's Scan refuses
// *pgtype.DriverBytes, whose bytes would outlive the connection given back here. A row with no
// rows is a success for the statement's budgets and telemetry: the query ran.
func (r *pgxRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	if !r.open.inFlight() {
		return r.row.Scan(dest...) // scanned before: pgx's answer; the statement has ended
	}
	outcome := errPanicked // until pgx's Scan returns: a panic ends the statement with it
	defer func() { r.open.finish(outcome) }()
	err := r.row.Scan(dest...)
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			outcome = nil // the query ran to its end: a success, and no overrun
			return err
		}
		err = overran(r.open.qctx, err)
	}
	outcome = err
	return err
}

// errRows are the rows of a query that did not run or failed: every method reports err, as
// pgxpool's rows of a query that could not acquire a connection do. of are the rows pgx
// returned with err on a connection the caller holds (a PoolConn's, a transaction's), whose
// Conn and TypeMap are theirs, as pgx's own failed rows keep them; nil otherwise.
type errRows struct {
	err error
	of  pgx.Rows
}

var _ pgx.Rows = errRows{}

func (errRows) Close()                                       {}
func (e errRows) Err() error                                 { return e.err }
func (errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (errRows) Next() bool                                   { return false }
func (e errRows) Scan(...any) error                          { return e.err }
func (e errRows) Values() ([]any, error)                     { return nil, e.err }
func (errRows) RawValues() [][]byte                          { return nil }

func (e errRows) Conn() *pgx.Conn {
	if e.of == nil {
		return nil
	}
	return e.of.Conn()
}

func (e errRows) TypeMap() *pgtype.Map {
	if e.of == nil {
		return nil
	}
	return e.of.TypeMap()
}
