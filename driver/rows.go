package driver

import (
	"database/sql/driver"
	"io"
	"reflect"
)

// rows finishes its statement when the rows are exhausted, fail, or are closed early: the
// statement's concurrency slots are held until then, or until the rows are garbage-collected
// unclosed (see leak.go). database/sql never calls Next and Close concurrently (it serialises
// them with its closemu), so the statement needs no lock.
type rows struct {
	driver.Rows
	open  *openStmt // the statement; never nil (newRows)
	own   *ticket   // the ticket each of its statements is decided in (newRows)
	owner *conn     // the connection whose spare wrapper this is; nil for another one
	// vals is the current row of a parent without driver.RowsColumnScanner, read by NextRow for
	// ScanColumn (Go 1.27 and later, see rows_go127.go); nil otherwise.
	vals []driver.Value
	// failed is the error a step through the rows returned, which Close finishes the statement
	// with; nil otherwise.
	failed error
}

// The column-type interfaces pgx's rows implement, passed through so that
// (*sql.ColumnType) reports what raw pgx reports.
var (
	_ driver.Rows                           = (*rows)(nil)
	_ driver.RowsColumnTypeDatabaseTypeName = (*rows)(nil)
	_ driver.RowsColumnTypeLength           = (*rows)(nil)
	_ driver.RowsColumnTypePrecisionScale   = (*rows)(nil)
	_ driver.RowsColumnTypeScanType         = (*rows)(nil)
)

func (r *rows) finish(err error) { r.open.finish(err) }

func (r *rows) Next(dest []driver.Value) error { return r.advanced(r.Rows.Next(dest)) }

// advanced finishes the statement when a step through the rows ended them cleanly (io.EOF).
// Any other error (made to match ErrOverrun: overran) fails the statement, but need not end
// it: a row that pgx could not convert leaves the statement's other rows on the connection.
// database/sql closes the rows after such an error, and Close drains them, still under the
// statement's context and holding its slots, before it finishes the statement with the error.
func (r *rows) advanced(err error) error {
	switch {
	case err == io.EOF:
		r.finish(nil)
	case err != nil:
		err = r.overran(err)
		r.failed = err
	}
	return err
}

// overran returns err, made to match ErrOverrun when the statement's max_duration ended it
// (overrun.go), so that the engine counts the overrun and strikes the pattern.
func (r *rows) overran(err error) error {
	if q := r.open.qctx; q != nil {
		return overran(q, err)
	}
	return err
}

// Close finishes the statement and, for a connection's spare wrapper, hands it back, even when
// the parent's Close panics. database/sql calls it once, and never uses the rows after it.
// Closing rows early drains the rest of their statement: when its max_duration cuts that
// short, Close's error is an overrun, as Next's would be.
func (r *rows) Close() error {
	err := errPanicked // until the parent's Close returns
	defer func() {
		outcome := err
		if r.failed != nil && err != errPanicked {
			outcome = r.failed // what failed the statement, before the drain
		}
		r.failed = nil
		r.finish(outcome)
		r.handBack()
	}()
	err = r.overran(r.Rows.Close())
	return err
}

// free hands the wrapper back (handBack) unless its statement is in flight: after a query that
// was refused, failed or panicked.
func (r *rows) free() {
	if !r.open.inFlight() {
		r.handBack()
	}
}

// handBack makes a connection's spare wrapper, whose statement is finished, free for the next
// query; another wrapper is left to the garbage collector.
func (r *rows) handBack() {
	if c := r.owner; c != nil {
		r.Rows, r.vals = nil, nil // drop the pgx rows
		c.spare = r
	}
}

func (r *rows) ColumnTypeDatabaseTypeName(i int) string {
	if c, ok := r.Rows.(driver.RowsColumnTypeDatabaseTypeName); ok {
		return c.ColumnTypeDatabaseTypeName(i)
	}
	return ""
}

func (r *rows) ColumnTypeLength(i int) (int64, bool) {
	if c, ok := r.Rows.(driver.RowsColumnTypeLength); ok {
		return c.ColumnTypeLength(i)
	}
	return 0, false
}

func (r *rows) ColumnTypePrecisionScale(i int) (int64, int64, bool) {
	if c, ok := r.Rows.(driver.RowsColumnTypePrecisionScale); ok {
		return c.ColumnTypePrecisionScale(i)
	}
	return 0, 0, false
}

func (r *rows) ColumnTypeScanType(i int) reflect.Type {
	if c, ok := r.Rows.(driver.RowsColumnTypeScanType); ok {
		return c.ColumnTypeScanType(i)
	}
	return reflect.TypeFor[any]()
}
