//go:build go1.27

package driver

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"slices"
	"testing"
)

// scannerConn is a fakeConn whose rows scan columns themselves, as pgx's do on Go 1.27.
type scannerConn struct{ fakeConn }

func (c *scannerConn) QueryContext(context.Context, string, []driver.NamedValue) (driver.Rows, error) {
	c.queries++
	return &scannerRows{n: 2}, nil
}

// scannerRows fills a *[]string, which no driver.Value conversion can: only a scan forwarded to
// the driver's ScanColumn fills it.
type scannerRows struct{ n int }

func (r *scannerRows) Columns() []string { return []string{"names"} }
func (r *scannerRows) Close() error      { return nil }
func (r *scannerRows) Next([]driver.Value) error {
	return errors.New("Next called: database/sql should use NextRow")
}
func (r *scannerRows) NextRow() error {
	if r.n == 0 {
		return io.EOF
	}
	r.n--
	return nil
}
func (r *scannerRows) ScanColumn(_ driver.ScanContext, _ int, dest any) error {
	p, ok := dest.(*[]string)
	if !ok {
		return errors.New("not a *[]string")
	}
	*p = []string{"John", "Jane"}
	return nil
}

// TestRowsColumnScanner: the rows wrapper forwards the parent's RowsColumnScanner (database/sql
// scans into *[]string through it) and finishes the statement at the end of the rows.
func TestRowsColumnScanner(t *testing.T) {
	fc := &scannerConn{}
	c, db := fakeDB(t, `
budgets:
  - {name: one, mode: enforce, max_concurrent: 1}
rules:
  - {budget: one, match: {statement: select}}
`, fc)
	rows, err := db.Query("select names from t")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var names []string
		if err := rows.Scan(&names); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(names, []string{"John", "Jane"}) {
			t.Fatalf("scanned %q", names)
		}
		n++
	}
	if err := rows.Err(); err != nil || n != 2 {
		t.Fatalf("%d rows, %v", n, err)
	}
	if got := c.Snapshot().Budgets[0].InFlight; got != 0 {
		t.Fatalf("in flight after the rows ended: %d, want 0", got)
	}
	// The slot is back: a second query is admitted (and rows.Close is not what released it).
	if r2, err := db.Query("select names from t"); err != nil {
		t.Fatalf("second query: %v", err)
	} else {
		r2.Close()
	}
	rows.Close()
}

// TestRowsColumnScannerFallback: over a parent without RowsColumnScanner the wrapper reads rows
// with Next and converts them as database/sql would.
func TestRowsColumnScannerFallback(t *testing.T) {
	fc := &fakeConn{}
	c, db := fakeDB(t, `
budgets:
  - {name: one, mode: enforce, max_concurrent: 1}
rules:
  - {budget: one, match: {statement: select}}
`, fc)
	rows, err := db.Query("select x from t")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var s string // int64 in the row: converted by sql.ConvertAssign
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	if err := rows.Err(); err != nil || !slices.Equal(got, []string{"1", "0"}) {
		t.Fatalf("rows %q, %v", got, err)
	}
	if n := c.Snapshot().Budgets[0].InFlight; n != 0 {
		t.Fatalf("in flight after the rows ended: %d, want 0", n)
	}
}
