package driver

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"sync"
	"testing"
)

// fakeConn is a driver.Conn with the context interfaces, counting what reaches it.
type fakeConn struct{ execs, queries int }

func (c *fakeConn) Prepare(string) (driver.Stmt, error) { return &fakeStmt{c: c}, nil }
func (c *fakeConn) Close() error                        { return nil }
func (c *fakeConn) Begin() (driver.Tx, error)           { return nil, errors.New("no tx") }
func (c *fakeConn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	return nil, errors.New("no tx")
}
func (c *fakeConn) PrepareContext(context.Context, string) (driver.Stmt, error) {
	return &fakeStmt{c: c}, nil
}
func (c *fakeConn) Ping(context.Context) error               { return nil }
func (c *fakeConn) ResetSession(context.Context) error       { return nil }
func (c *fakeConn) CheckNamedValue(*driver.NamedValue) error { return nil }
func (c *fakeConn) ExecContext(context.Context, string, []driver.NamedValue) (driver.Result, error) {
	c.execs++
	return driver.RowsAffected(1), nil
}
func (c *fakeConn) QueryContext(context.Context, string, []driver.NamedValue) (driver.Rows, error) {
	c.queries++
	return &fakeRows{n: 2}, nil
}

type fakeStmt struct{ c *fakeConn }

func (s *fakeStmt) Close() error  { return nil }
func (s *fakeStmt) NumInput() int { return -1 }
func (s *fakeStmt) Exec([]driver.Value) (driver.Result, error) {
	s.c.execs++
	return driver.RowsAffected(1), nil
}
func (s *fakeStmt) Query([]driver.Value) (driver.Rows, error) {
	s.c.queries++
	return &fakeRows{n: 1}, nil
}
func (s *fakeStmt) ExecContext(context.Context, []driver.NamedValue) (driver.Result, error) {
	s.c.execs++
	return driver.RowsAffected(1), nil
}
func (s *fakeStmt) QueryContext(context.Context, []driver.NamedValue) (driver.Rows, error) {
	s.c.queries++
	return &fakeRows{n: 1}, nil
}

type fakeRows struct{ n int }

func (r *fakeRows) Columns() []string { return []string{"x"} }
func (r *fakeRows) Close() error      { return nil }
func (r *fakeRows) Next(dest []driver.Value) error {
	if r.n == 0 {
		return io.EOF
	}
	r.n--
	dest[0] = int64(r.n)
	return nil
}

// fakeConnector opens pgtraffic connections over fakeConns.
type fakeConnector struct {
	conn driver.Conn
	intr *interceptor
}

func (f fakeConnector) Connect(context.Context) (driver.Conn, error) { return newConn(f.conn, f.intr) }
func (f fakeConnector) Driver() driver.Driver                        { return &Driver{} }

// fakeDB returns a connector with rules and a *sql.DB whose connections are pgtraffic's over fc;
// both are closed when the test ends.
func fakeDB(t *testing.T, rules string, fc driver.Conn) (*Connector, *sql.DB) {
	t.Helper()
	cfg, err := ParseConfig([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConnector("postgres://u@localhost/db", WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	db := sql.OpenDB(fakeConnector{conn: fc, intr: &interceptor{engine: c.engine, leaks: c.intr.leaks}})
	t.Cleanup(func() { db.Close() })
	return c, db
}

func TestBlockedError(t *testing.T) {
	err := error(&BlockedError{Budget: "reporting", Rule: "app=reporting", Reason: ReasonBudget,
		Fingerprint: "0123456789abcdef", RetryAfter: 1500e6, Limit: "burst_limit=10s"})
	if !errors.Is(err, ErrBlocked) {
		t.Fatal("errors.Is(err, ErrBlocked) is false")
	}
	var be *BlockedError
	if !errors.As(err, &be) || be.SQLState() != "53000" {
		t.Fatal("errors.As or SQLState")
	}
	if errors.Is(err, driver.ErrBadConn) {
		t.Fatal("a blocked statement must never be ErrBadConn: database/sql would retry it")
	}
	want := `pgtraffic: statement blocked by budget "reporting" (reason budget, burst_limit=10s, fingerprint 0123456789abcdef, retry after 1.5s)`
	if err.Error() != want {
		t.Fatalf("message\n got %s\nwant %s", err.Error(), want)
	}
	g := &BlockedError{Budget: "require_where", Rule: "require_where", Reason: ReasonGuard, Fingerprint: "f"}
	if got := g.Error(); got != `pgtraffic: statement blocked by guard "require_where" (reason guard, fingerprint f)` {
		t.Fatalf("guard message: %s", got)
	}
}

// TestBlockedNothingSent runs the interceptor over a fake connection: a blocked statement never
// reaches it, an allowed one does, and Rows release their slot when exhausted or closed.
func TestBlockedNothingSent(t *testing.T) {
	fc := &fakeConn{}
	c, db := fakeDB(t, `
budgets:
  - {name: one, mode: enforce, max_concurrent: 1}
rules:
  - {budget: one, match: {statement: select}}
guards:
  require_where: enforce
`, fc)
	db.SetMaxOpenConns(2)

	if _, err := db.Exec("delete from t"); !errors.Is(err, ErrBlocked) {
		t.Fatalf("guard: %v", err)
	}
	if fc.execs != 0 {
		t.Fatalf("a blocked statement reached the connection")
	}
	rows, err := db.Query("select x from t")
	if err != nil {
		t.Fatal(err)
	}
	// The slot is held while rows are open: a second select is blocked and never sent.
	if _, err := db.Query("select x from t"); !errors.Is(err, ErrBlocked) {
		t.Fatalf("second select while rows are open: %v", err)
	}
	if fc.queries != 1 {
		t.Fatalf("queries sent: %d", fc.queries)
	}
	n := 0
	for rows.Next() {
		n++
	}
	if n != 2 || rows.Err() != nil {
		t.Fatalf("rows %d %v", n, rows.Err())
	}
	// Exhausted: the slot is back.
	rows, err = db.Query("select x from t")
	if err != nil {
		t.Fatalf("after exhausting rows: %v", err)
	}
	rows.Close() // closed early: the slot is back too
	if _, err := db.Exec("select 1"); err != nil {
		t.Fatalf("after closing rows: %v", err)
	}
	// Prepared statements are decided on each execution.
	st, err := db.Prepare("select x from t where id = $1")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r1, err := st.Query(1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Query(2); !errors.Is(err, ErrBlocked) {
		t.Fatalf("second prepared select while rows are open: %v", err)
	}
	r1.Close()
	if _, err := st.Exec(3); err != nil {
		t.Fatalf("prepared exec after closing rows: %v", err)
	}
	if got := c.Snapshot().Budgets[0].InFlight; got != 0 {
		t.Fatalf("in flight %d", got)
	}
}

// TestDriverOpenSharesConnector: connections opened with Driver.Open for one DSN share one
// connector (one set of budgets, one rules watcher).
func TestDriverOpenSharesConnector(t *testing.T) {
	d := &Driver{}
	// The connector is created without connecting; connecting fails (nothing listens there),
	// which is fine: the connector is what is shared.
	const dsn = "postgres://u@127.0.0.1:1/db?connect_timeout=1"
	d.Open(dsn)
	d.Open(dsn)
	d.Open(dsn + "&application_name=other")
	if len(d.open) != 2 {
		t.Fatalf("%d connectors for 2 DSNs", len(d.open))
	}
	for _, c := range d.open {
		c.Close()
	}
}

// TestRowsOnOneConnection opens several result sets on one connection at once (database/sql
// allows it on a *sql.Conn or *sql.Tx; pgx would refuse, the fake does not): each keeps its own
// statement, whether it got the connection's spare wrapper or a new one, and each statement's
// slot is given back when its rows close.
func TestRowsOnOneConnection(t *testing.T) {
	fc := &fakeConn{}
	c, db := fakeDB(t, `
budgets:
  - {name: four, mode: enforce, max_concurrent: 4}
rules:
  - {budget: four, match: {statement: select}}
`, fc)
	ctx := context.Background()
	sc, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	inFlight := func() int { return c.Snapshot().Budgets[0].InFlight }

	var open []*sql.Rows
	for i := range 3 {
		r, err := sc.QueryContext(ctx, "select x from t")
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, r)
		if got := inFlight(); got != i+1 {
			t.Fatalf("after %d queries in flight %d", i+1, got)
		}
	}
	// Close the first (the spare wrapper), then exhaust the others.
	open[0].Close()
	if got := inFlight(); got != 2 {
		t.Fatalf("after closing the first rows in flight %d, want 2", got)
	}
	for _, r := range open[1:] {
		n := 0
		for r.Next() {
			n++
		}
		if n != 2 || r.Err() != nil {
			t.Fatalf("rows %d %v", n, r.Err())
		}
	}
	if got := inFlight(); got != 0 {
		t.Fatalf("after exhausting all rows in flight %d", got)
	}
	// The spare is free again: a new query uses it and finishes.
	for range 2 {
		var x int
		if err := sc.QueryRowContext(ctx, "select x from t").Scan(&x); err != nil {
			t.Fatal(err)
		}
	}
	if got := inFlight(); got != 0 {
		t.Fatalf("in flight %d", got)
	}
}

// TestStatementsFinishOnOtherGoroutines: rows exhausted on other goroutines finish their
// statements (giving back the connection's spare engine state) while the connection runs more
// statements; run with -race.
func TestStatementsFinishOnOtherGoroutines(t *testing.T) {
	c, db := fakeDB(t, `
budgets:
  - {name: many, mode: enforce, max_concurrent: 1000}
rules:
  - {budget: many, match: {statement: select}}
`, &fakeConn{})
	ctx := context.Background()
	sc, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	var wg sync.WaitGroup
	for range 200 {
		r, err := sc.QueryContext(ctx, "select x from t")
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r.Next() {
			}
			r.Close()
		}()
	}
	wg.Wait()
	if got := c.Snapshot().Budgets[0].InFlight; got != 0 {
		t.Fatalf("in flight %d after every rows closed", got)
	}
}
