package pgxexplain

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// countingConn counts the bytes a connection writes, to prove that nothing was sent.
type countingConn struct {
	net.Conn
	written atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.written.Add(int64(n))
	return n, err
}

// testConn is a pgx connection, as a front end hands it to Explain, plus its byte counter.
type testConn struct {
	*pgx.Conn
	net *countingConn
}

func (c testConn) written() int64 { return c.net.written.Load() }

// newDatabase returns a DSN for a fresh database holding table t (10,000 rows, analysed).
func newDatabase(t *testing.T) string {
	t.Helper()
	dsn := pgtest.Shared(t).CreateDatabase(t)
	c := connect(t, dsn)
	c.exec(t, `CREATE TABLE t (id int PRIMARY KEY, name text, at timestamptz, flag bool)`)
	c.exec(t, `INSERT INTO t SELECT g, 'n' || g, '2026-01-01'::timestamptz + g * interval '1 minute', g % 2 = 0
		FROM generate_series(1, 10000) g`)
	c.exec(t, `ANALYZE t`)
	return dsn
}

func connect(t testing.TB, dsn string) testConn {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	var counted *countingConn
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		counted = &countingConn{Conn: nc}
		return counted, nil
	}
	pc, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := testConn{Conn: pc, net: counted}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// exec runs a caller's statement on the connection.
func (c testConn) exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func (c testConn) scalar(t testing.TB, sql string, dst any) {
	t.Helper()
	if err := c.QueryRow(context.Background(), sql).Scan(dst); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// testTx is the caller's transaction on a testConn.
type testTx struct{ tx pgx.Tx }

func (t testTx) Commit() error   { return t.tx.Commit(context.Background()) }
func (t testTx) Rollback() error { return t.tx.Rollback(context.Background()) }

func (c testConn) begin(t testing.TB) testTx {
	t.Helper()
	tx, err := c.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return testTx{tx}
}

func (c testConn) txStatus() byte { return c.PgConn().TxStatus() }

// directCost is the total cost of EXPLAIN (FORMAT JSON) sql with args run plainly with pgx.
func directCost(t *testing.T, c testConn, sql string, args ...any) float64 {
	t.Helper()
	var out []byte
	if err := c.QueryRow(context.Background(), "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&out); err != nil {
		t.Fatalf("direct explain: %v", err)
	}
	plan, err := parsePlan(out)
	if err != nil {
		t.Fatal(err)
	}
	return plan.Cost
}

func TestExplain(t *testing.T) {
	c := connect(t, newDatabase(t))
	ctx := context.Background()
	at := time.Date(2026, 1, 3, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		sql  string
		args []any
	}{
		{"plain select", `SELECT * FROM t`, nil},
		{"trailing semicolon and comments", `/* app=x */ SELECT * FROM t WHERE id > 5; -- done`, nil},
		{"int argument", `SELECT * FROM t WHERE id = $1`, []any{int64(42)}},
		{"int32 argument", `SELECT * FROM t WHERE id < $1`, []any{int32(5000)}},
		{"text argument", `SELECT * FROM t WHERE name = $1`, []any{"n7"}},
		{"timestamp argument", `SELECT * FROM t WHERE at < $1`, []any{at}},
		{"NULL argument", `SELECT * FROM t WHERE name IS NOT DISTINCT FROM $1`, []any{nil}},
		{"bool and float arguments", `SELECT * FROM t WHERE flag = $1 AND id > $2 AND id::float8 < $3`, []any{true, float64(10), 99.5}},
		{"bytes argument", `SELECT * FROM t WHERE name = $1`, []any{[]byte("n8")}},
		{"insert", `INSERT INTO t VALUES ($1, $2, $3, $4)`, []any{int64(-1), "x", at, false}},
		{"update", `UPDATE t SET name = $1 WHERE id = $2`, []any{"y", int64(3)}},
		{"delete returning", `DELETE FROM t WHERE id < $1 RETURNING *`, []any{int64(100)}},
		{"data-modifying CTE", `WITH d AS (DELETE FROM t WHERE id = $1 RETURNING *) SELECT count(*) FROM d`, []any{int64(9)}},
		{"insert returning", `INSERT INTO t SELECT id + 100000, name, at, flag FROM t RETURNING id`, nil},
		{"merge", `MERGE INTO t USING (SELECT $1::int AS id) s ON t.id = s.id WHEN MATCHED THEN DELETE`, []any{int64(4)}},
		{"parenthesised select", `(SELECT * FROM t WHERE id = $1)`, []any{int64(4)}},
		{"values", `VALUES ($1::int, $2::text)`, []any{int64(1), "a"}},
		{"table", `TABLE t`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, err := Explain(ctx, c.Conn, tt.sql, tt.args)
			if err != nil {
				t.Fatalf("Explain: %v", err)
			}
			got := plan.Cost
			if want := directCost(t, c, tt.sql, tt.args...); got != want || got <= 0 {
				t.Fatalf("Explain = %v, want the direct EXPLAIN's %v (> 0)", got, want)
			}
			if c.txStatus() != 'I' {
				t.Fatalf("tx status %q after Explain, want idle", c.txStatus())
			}
		})
	}
	var n int
	c.scalar(t, `SELECT count(*) FROM t`, &n)
	if n != 10000 {
		t.Fatalf("explained statements changed the table: %d rows, want 10000", n)
	}
}

func TestExplainArgumentsChangeTheCost(t *testing.T) {
	c := connect(t, newDatabase(t))
	ctx := context.Background()
	const q = `SELECT * FROM t WHERE id < $1`
	few, err := Explain(ctx, c.Conn, q, []any{int64(10)})
	if err != nil {
		t.Fatal(err)
	}
	all, err := Explain(ctx, c.Conn, q, []any{int64(1_000_000)})
	if err != nil {
		t.Fatal(err)
	}
	// The values are planned as constants, as for the caller's own unnamed statement.
	if !(all.Cost > 10*few.Cost) {
		t.Fatalf("cost for id < 1e6 = %v, for id < 10 = %v: want the values to drive the plan", all, few)
	}
}

func TestExplainNamedArgs(t *testing.T) {
	c := connect(t, newDatabase(t))
	got, err := Explain(context.Background(), c.Conn, `SELECT * FROM t WHERE id = @id`, []any{pgx.NamedArgs{"id": 5}})
	if err != nil {
		t.Fatal(err)
	}
	if want := directCost(t, c, `SELECT * FROM t WHERE id = $1`, 5); got.Cost != want {
		t.Fatalf("Explain = %v, want %v", got, want)
	}
	got, err = Explain(context.Background(), c.Conn, `SELECT * FROM t WHERE id = $1`, []any{pgx.QueryExecModeSimpleProtocol, 5})
	if err != nil || got.Cost <= 0 {
		t.Fatalf("Explain with a leading QueryExecMode = %v, %v; want the option dropped", got, err)
	}
}

func TestExplainFailures(t *testing.T) {
	c := connect(t, newDatabase(t))
	ctx := context.Background()
	tests := []struct {
		name      string
		sql       string
		args      []any
		wantState string
		secret    string // must not appear in the error
	}{
		{"missing table", `SELECT * FROM missing_secret_table`, nil, "42P01", "missing_secret_table"},
		{"bad argument", `SELECT * FROM t WHERE id = $1`, []any{"secret-value"}, "22P02", "secret-value"},
		{"several statements are not run", `SELECT 1; DELETE FROM t WHERE name <> 'secret'`, nil, "42601", "secret"},
		{"utility statement", `VACUUM t`, nil, "42601", ""},
	}
	for _, tt := range tests {
		for _, inTx := range []bool{false, true} {
			name := tt.name
			if inTx {
				name += " in a transaction"
			}
			t.Run(name, func(t *testing.T) {
				var tx testTx
				if inTx {
					tx = c.begin(t)
					c.exec(t, `INSERT INTO t VALUES (-7, 'before', now(), true)`)
				}
				_, err := Explain(ctx, c.Conn, tt.sql, tt.args)
				if err == nil || !strings.Contains(err.Error(), "SQLSTATE "+tt.wantState) {
					t.Fatalf("Explain error = %v, want SQLSTATE %s", err, tt.wantState)
				}
				if errors.Is(err, cost.ErrNotSent) || errors.Is(err, ErrNotRestored) {
					t.Fatalf("Explain error = %v: it was sent, and the savepoint restored", err)
				}
				if tt.secret != "" && strings.Contains(err.Error(), tt.secret) {
					t.Fatalf("error %q quotes the statement or its arguments", err)
				}
				if !inTx {
					if c.txStatus() != 'I' {
						t.Fatalf("tx status %q, want idle", c.txStatus())
					}
					return
				}
				if c.txStatus() != 'T' {
					t.Fatalf("tx status %q after a failed Explain, want 'T' (usable)", c.txStatus())
				}
				c.exec(t, `INSERT INTO t VALUES (-8, 'after', now(), true)`)
				if err := tx.Commit(); err != nil {
					t.Fatalf("commit: %v", err)
				}
				var n int
				c.scalar(t, `SELECT count(*) FROM t WHERE id IN (-7, -8)`, &n)
				if n != 2 {
					t.Fatalf("%d of the transaction's 2 writes committed", n)
				}
				c.exec(t, `DELETE FROM t WHERE id IN (-7, -8)`)
			})
		}
	}
	var n int
	c.scalar(t, `SELECT count(*) FROM t`, &n)
	if n != 10000 {
		t.Fatalf("table has %d rows, want 10000", n)
	}
}

func TestExplainInTransaction(t *testing.T) {
	c := connect(t, newDatabase(t))
	ctx := context.Background()

	t.Run("success leaves no savepoint", func(t *testing.T) {
		tx := c.begin(t)
		defer tx.Rollback()
		if _, err := Explain(ctx, c.Conn, `SELECT * FROM t WHERE id = $1`, []any{int64(1)}); err != nil {
			t.Fatal(err)
		}
		if c.txStatus() != 'T' {
			t.Fatalf("tx status %q, want 'T'", c.txStatus())
		}
		_, err := c.Exec(ctx, `RELEASE SAVEPOINT pgtraffic_explain`)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "3B001" {
			t.Fatalf("RELEASE of our savepoint = %v, want 3B001 (no such savepoint)", err)
		}
	})

	t.Run("caller's savepoint of the same name survives", func(t *testing.T) {
		tx := c.begin(t)
		c.exec(t, `SAVEPOINT pgtraffic_explain`)
		c.exec(t, `INSERT INTO t VALUES (-1, 'x', now(), true)`)
		if _, err := Explain(ctx, c.Conn, `SELECT * FROM missing`, nil); err == nil {
			t.Fatal("Explain of a missing table succeeded")
		}
		c.exec(t, `ROLLBACK TO SAVEPOINT pgtraffic_explain`)
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		var n int
		c.scalar(t, `SELECT count(*) FROM t WHERE id = -1`, &n)
		if n != 0 {
			t.Fatal("the caller's ROLLBACK TO did not reach the caller's savepoint")
		}
	})

	t.Run("locks and SET LOCAL survive a failure", func(t *testing.T) {
		tx := c.begin(t)
		defer tx.Rollback()
		c.exec(t, `LOCK TABLE t IN SHARE MODE`)
		c.exec(t, `SET LOCAL work_mem = '7MB'`)
		if _, err := Explain(ctx, c.Conn, `SELECT * FROM missing`, nil); err == nil {
			t.Fatal("Explain of a missing table succeeded")
		}
		var locks int
		c.scalar(t, `SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid()
			AND relation = 't'::regclass AND mode = 'ShareLock' AND granted`, &locks)
		if locks != 1 {
			t.Fatalf("caller's ShareLock count = %d, want 1", locks)
		}
		var wm string
		c.scalar(t, `SHOW work_mem`, &wm)
		if wm != "7MB" {
			t.Fatalf("work_mem = %s, want the caller's SET LOCAL 7MB", wm)
		}
	})

	t.Run("a failed explain releases its own locks", func(t *testing.T) {
		tx := c.begin(t)
		defer tx.Rollback()
		// UPDATE takes RowExclusiveLock while planning; the error path must give it back.
		if _, err := Explain(ctx, c.Conn, `UPDATE t SET id = $1`, []any{"nope"}); err == nil {
			t.Fatal("Explain with a bad argument succeeded")
		}
		var locks int
		c.scalar(t, `SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid()
			AND relation = 't'::regclass AND mode = 'RowExclusiveLock'`, &locks)
		if locks != 0 {
			t.Fatalf("RowExclusiveLock held after a failed explain: %d", locks)
		}
	})
}

func TestExplainSendsNothing(t *testing.T) {
	dsn := newDatabase(t)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		setup   func(t *testing.T, c testConn) (cleanup func())
		args    []any
		wantErr error
	}{
		{
			name: "aborted transaction",
			ctx:  context.Background(),
			setup: func(t *testing.T, c testConn) func() {
				tx := c.begin(t)
				if _, err := c.Exec(context.Background(), `SELECT 1/0`); err == nil {
					t.Fatal("division by zero succeeded")
				}
				if c.txStatus() != 'E' {
					t.Fatalf("tx status %q, want 'E'", c.txStatus())
				}
				return func() { tx.Rollback() }
			},
			wantErr: ErrTxAborted,
		},
		{
			name: "busy connection",
			ctx:  context.Background(),
			setup: func(t *testing.T, c testConn) func() {
				rows, err := c.Query(context.Background(), `SELECT * FROM t`)
				if err != nil {
					t.Fatal(err)
				}
				return rows.Close
			},
			wantErr: ErrConnBusy,
		},
		{
			name:    "cancelled context",
			ctx:     cancelled,
			setup:   func(*testing.T, testConn) func() { return func() {} },
			wantErr: context.Canceled,
		},
		{
			name:    "unencodable argument",
			ctx:     context.Background(),
			setup:   func(*testing.T, testConn) func() { return func() {} },
			args:    []any{make(chan int)},
			wantErr: cost.ErrNotSent,
		},
		{
			name: "closed connection",
			ctx:  context.Background(),
			setup: func(t *testing.T, c testConn) func() {
				c.Close(context.Background())
				return func() {}
			},
			wantErr: ErrConnClosed,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := connect(t, dsn)
			cleanup := tt.setup(t, c)
			defer cleanup()
			args := tt.args
			if args == nil {
				args = []any{int64(1)}
			}
			before, status := c.written(), c.txStatus()
			_, err := Explain(tt.ctx, c.Conn, `SELECT * FROM t WHERE id = $1`, args)
			if !errors.Is(err, tt.wantErr) || !errors.Is(err, cost.ErrNotSent) {
				t.Fatalf("Explain error = %v, want %v wrapping cost.ErrNotSent", err, tt.wantErr)
			}
			if sent := c.written() - before; sent != 0 {
				t.Fatalf("Explain wrote %d bytes, want none", sent)
			}
			if c.txStatus() != status {
				t.Fatalf("tx status changed from %q to %q", status, c.txStatus())
			}
		})
	}
}

func TestExplainOnDeadConnection(t *testing.T) {
	dsn := newDatabase(t)
	for _, inTx := range []bool{false, true} {
		t.Run(map[bool]string{false: "idle", true: "in a transaction"}[inTx], func(t *testing.T) {
			c := connect(t, dsn)
			if inTx {
				c.begin(t)
			}
			var pid int
			c.scalar(t, `SELECT pg_backend_pid()`, &pid)
			killer := connect(t, dsn)
			killer.exec(t, `SELECT pg_terminate_backend($1)`, int64(pid))
			_, err := Explain(context.Background(), c.Conn, `SELECT * FROM t`, nil)
			if err == nil || errors.Is(err, cost.ErrNotSent) {
				t.Fatalf("Explain on a terminated backend = %v, want a failure after sending", err)
			}
			if !c.IsClosed() {
				t.Fatal("connection not reported closed")
			}
		})
	}
}

func TestExplainLeavesPreparedStatements(t *testing.T) {
	c := connect(t, newDatabase(t))
	ctx := context.Background()
	// The caller's own prepared statement, as database/sql's Prepare leaves one.
	const stmt = "caller_stmt"
	if _, err := c.Prepare(ctx, stmt, `SELECT count(*) FROM t WHERE id < $1`); err != nil {
		t.Fatal(err)
	}
	// A statement in pgx's statement cache, as database/sql's Query leaves one.
	var n int
	c.scalar(t, `SELECT count(*) FROM t`, &n)
	var prepared int
	c.scalar(t, `SELECT count(*) FROM pg_prepared_statements`, &prepared)

	tx := c.begin(t)
	for _, q := range []string{`SELECT * FROM t WHERE id = $1`, `SELECT * FROM missing WHERE id = $1`} {
		Explain(ctx, c.Conn, q, []any{int64(1)})
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	Explain(ctx, c.Conn, `SELECT * FROM t WHERE id = $1`, []any{int64(1)})

	var after int
	c.scalar(t, `SELECT count(*) FROM pg_prepared_statements`, &after)
	if after != prepared {
		t.Fatalf("prepared statements: %d before, %d after Explain", prepared, after)
	}
	var got int64
	if err := c.QueryRow(ctx, stmt, int64(100)).Scan(&got); err != nil || got != 99 {
		t.Fatalf("caller's prepared statement after Explain returned %v, %v; want 99", got, err)
	}
}

func BenchmarkExplain(b *testing.B) {
	srv := pgtest.Shared(b)
	dsn := srv.CreateDatabase(b)
	c := connect(b, dsn)
	c.exec(b, `CREATE TABLE t (id int PRIMARY KEY, name text)`)
	ctx := context.Background()
	args := []any{int64(1)}
	b.Run("idle", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Explain(ctx, c.Conn, `SELECT * FROM t WHERE id = $1`, args); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("in transaction", func(b *testing.B) {
		tx := c.begin(b)
		defer tx.Rollback()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Explain(ctx, c.Conn, `SELECT * FROM t WHERE id = $1`, args); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestExplainSimpleProtocolHasNoQueryID: a statement sent with pgx's simple protocol has its
// arguments written into its text, and the server gives such a text a query identifier apart
// from the EXPLAIN's, which has parameters: Explain reports none, so that the pattern stays on
// the client's clock (and a reader that finds no identifier says why) rather than waiting on
// counters that never grow. Whether by a leading option or by the connection's default.
func TestExplainSimpleProtocolHasNoQueryID(t *testing.T) {
	dsn := newDatabase(t)
	c := connect(t, dsn)
	var computes string
	if err := c.QueryRow(context.Background(), "SHOW compute_query_id").Scan(&computes); err != nil {
		t.Fatal(err)
	}
	const q = `SELECT * FROM t WHERE id = $1`
	extended, err := Explain(context.Background(), c.Conn, q, []any{5})
	if err != nil {
		t.Fatal(err)
	}
	if extended.QueryID == 0 {
		t.Fatalf("the extended protocol's EXPLAIN reports no query identifier (compute_query_id %s): the test needs one", computes)
	}
	byOption, err := Explain(context.Background(), c.Conn, q, []any{pgx.QueryExecModeSimpleProtocol, 5})
	if err != nil || byOption.QueryID != 0 || byOption.Cost <= 0 {
		t.Errorf("Explain with a leading QueryExecModeSimpleProtocol = %+v, %v; want a cost and no query identifier", byOption, err)
	}
	cfg, err := pgx.ParseConfig(dsn + "&default_query_exec_mode=simple_protocol")
	if err != nil {
		t.Fatal(err)
	}
	sc, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close(context.Background())
	byDefault, err := Explain(context.Background(), sc, q, []any{5})
	if err != nil || byDefault.QueryID != 0 || byDefault.Cost <= 0 {
		t.Errorf("Explain on a connection whose default is the simple protocol = %+v, %v; want a cost and no query identifier", byDefault, err)
	}
}
