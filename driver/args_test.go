package driver

import (
	"context"
	"database/sql/driver"
	"testing"
)

// argsConn is a fakeConn whose queries answer with one reused rows value, so that what a
// statement allocates is pgtraffic's alone.
type argsConn struct {
	fakeConn
	rows fakeRows
}

func (c *argsConn) QueryContext(context.Context, string, []driver.NamedValue) (driver.Rows, error) {
	c.rows.n = 1
	return &c.rows, nil
}

// TestStatementArgsAllocateNothing: the database/sql front end hands the engine a statement's
// arguments as Go values without allocating per statement (a per-connection slice), on Exec and
// Query, and keeps no reference to them once the engine has decided.
func TestStatementArgsAllocateNothing(t *testing.T) {
	c, _ := fakeDB(t, `
budgets:
  - {name: b, mode: enforce, max_concurrent: 10}
rules:
  - {budget: b, match: {statement: select}}
`, &fakeConn{})
	pc, err := newConn(&argsConn{}, &interceptor{engine: c.engine, leaks: c.intr.leaks})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const q = "select x from t where id = $1 and name = $2"
	args := []driver.NamedValue{{Ordinal: 1, Value: int64(7)}, {Ordinal: 2, Value: "seven"}}
	dest := make([]driver.Value, 1)
	stmt := func() {
		if _, err := pc.ExecContext(ctx, q, args); err != nil {
			t.Fatal(err)
		}
		r, err := pc.QueryContext(ctx, q, args)
		if err != nil {
			t.Fatal(err)
		}
		for r.Next(dest) == nil {
		}
		r.Close()
	}
	stmt() // the first statement makes the connection's slices
	if n := testing.AllocsPerRun(100, stmt); n != 0 {
		t.Fatalf("a statement with arguments allocates %v times, want 0", n)
	}
	if len(pc.args) != len(args) {
		t.Fatalf("the connection's argument slice holds %d values, want %d (reused)", len(pc.args), len(args))
	}
	for i, v := range pc.args {
		if v != nil {
			t.Fatalf("argument %d (%v) kept after the statement was decided", i, v)
		}
	}
	if got := c.Snapshot().Budgets[0].InFlight; got != 0 {
		t.Fatalf("in flight %d", got)
	}
}
