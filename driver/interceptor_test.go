package driver

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"testing"

	"github.com/ngrok/sqlmw"
)

// fakeConn is a driver.Conn with the context interfaces, counting what reaches it.
type fakeConn struct{ execs, queries int }

func (c *fakeConn) Prepare(string) (driver.Stmt, error) { return &fakeStmt{c: c}, nil }
func (c *fakeConn) Close() error                        { return nil }
func (c *fakeConn) Begin() (driver.Tx, error)           { return nil, errors.New("no tx") }
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

type fakeConnector struct{ conn *fakeConn }

func (f fakeConnector) Connect(context.Context) (driver.Conn, error) { return f.conn, nil }
func (f fakeConnector) Driver() driver.Driver                        { return parentDriver{f} }

// seeParent records what unwrapOne finds inside the values sqlmw hands the hooks.
type seeParent struct {
	sqlmw.NullInterceptor
	conns, stmts []any
}

func (s *seeParent) ConnExecContext(ctx context.Context, c driver.ExecerContext, q string, a []driver.NamedValue) (driver.Result, error) {
	s.conns = append(s.conns, unwrapOne(c))
	return c.ExecContext(ctx, q, a)
}

func (s *seeParent) ConnPrepareContext(ctx context.Context, c driver.ConnPrepareContext, q string) (context.Context, driver.Stmt, error) {
	s.conns = append(s.conns, unwrapOne(c))
	st, err := c.PrepareContext(ctx, q)
	return ctx, &stmt{Stmt: st}, err
}

func (s *seeParent) StmtExecContext(ctx context.Context, st driver.StmtExecContext, q string, a []driver.NamedValue) (driver.Result, error) {
	s.stmts = append(s.stmts, unwrapOne(st))
	return st.ExecContext(ctx, a)
}

// TestSQLMWLayout guards the one assumption pgtraffic makes about sqlmw's internals: the values
// it hands the Conn and Stmt hooks are single-field structs around the parent connection or
// statement, which pgxConnOf and stmtConnOf read to reach the pgx connection for EXPLAIN.
func TestSQLMWLayout(t *testing.T) {
	fc := &fakeConn{}
	intr := &seeParent{}
	d := sqlmw.Driver(parentDriver{fakeConnector{fc}}, intr).(driver.DriverContext)
	conn, err := d.OpenConnector("")
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	if _, err := db.Exec("select 1"); err != nil {
		t.Fatal(err)
	}
	st, err := db.Prepare("select $1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Exec(); err != nil {
		t.Fatal(err)
	}
	st.Close()
	if len(intr.conns) != 2 || intr.conns[0] != driver.Conn(fc) || intr.conns[1] != driver.Conn(fc) {
		t.Fatalf("sqlmw's parent connection wrapper changed: unwrapOne found %#v", intr.conns)
	}
	if len(intr.stmts) != 1 {
		t.Fatalf("stmt hooks: %d", len(intr.stmts))
	}
	if _, ok := intr.stmts[0].(*stmt); !ok {
		t.Fatalf("sqlmw's parent statement wrapper changed: unwrapOne found %T", intr.stmts[0])
	}
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
	cfg, err := ParseConfig([]byte(`
budgets:
  - {name: one, mode: enforce, max_concurrent: 1}
rules:
  - {budget: one, match: {statement: select}}
guards:
  require_where: enforce
`))
	if err != nil {
		t.Fatal(err)
	}
	fc := &fakeConn{}
	c, err := NewConnector("postgres://u@localhost/db", WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	intr := &interceptor{engine: c.engine}
	d := sqlmw.Driver(parentDriver{fakeConnector{fc}}, intr).(driver.DriverContext)
	conn, _ := d.OpenConnector("")
	db := sql.OpenDB(conn)
	defer db.Close()
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
	if got := c.Snapshot().Budgets[0].InFlight; got != 0 {
		t.Fatalf("in flight %d", got)
	}
}
