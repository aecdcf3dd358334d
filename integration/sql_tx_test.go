package integration

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	pgtdriver "github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// A statement refused inside a transaction leaves the transaction usable, with isolation
// levels, read-only, and savepoints.
func TestSQLTxRefusedStaysUsable(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: closed, mode: enforce, max_concurrent: 0}
  - {name: costly, mode: enforce, per_query_limit: 50ms}
rules:
  - {budget: closed, match: {app: closed}}
  - {budget: costly, match: {app: costly}}
guards:
  require_where: enforce
`)
	ctx := context.Background()
	mustExec(t, db, ctx, "create table acc (id int primary key, n int)")
	mustExec(t, db, ctx, "create table big (id int)")
	mustExec(t, db, ctx, "insert into big select generate_series(1, 200000)")
	mustExec(t, db, ctx, "analyze big")
	for _, iso := range []sql.IsolationLevel{sql.LevelDefault, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable} {
		for _, ro := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/ro=%v", iso, ro), func(t *testing.T) {
				mustExec(t, db, ctx, "delete from acc where id > -1")
				if ro {
					mustExec(t, db, ctx, "insert into acc values (1, 1)")
				}
				tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: iso, ReadOnly: ro})
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				if !ro {
					if _, err := tx.ExecContext(ctx, "insert into acc values (1, 1)"); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := tx.ExecContext(ctx, "savepoint s1"); err != nil {
					t.Fatal(err)
				}
				// Refused by each kind of refusal.
				_, err = tx.ExecContext(ctx, "delete from acc")
				if be := asBlocked(t, err); be.Reason != pgtdriver.ReasonGuard {
					t.Fatalf("guard: %+v", be)
				}
				_, err = tx.ExecContext(tagging.With(ctx, "app", "closed"), "select 1")
				asBlocked(t, err)
				_, err = tx.QueryContext(tagging.With(ctx, "app", "closed"), "select 1")
				asBlocked(t, err)
				var n int
				err = tx.QueryRowContext(tagging.With(ctx, "app", "costly"), "select count(*) from big a, big b").Scan(&n)
				if be := asBlocked(t, err); be.Reason != pgtdriver.ReasonPerQuery {
					t.Fatalf("cost: %+v", be)
				}
				if !pgconn.SafeToRetry(err) {
					t.Fatal("not SafeToRetry")
				}
				if errors.Is(err, driver.ErrBadConn) {
					t.Fatal("blocked is ErrBadConn")
				}
				// Admitted under the costly budget: an EXPLAIN in a savepoint.
				if err := tx.QueryRowContext(tagging.With(ctx, "app", "costly"), "select n from acc where id = $1", 1).Scan(&n); err != nil || n != 1 {
					t.Fatalf("costed statement in tx: %v %d", err, n)
				}
				if _, err := tx.ExecContext(ctx, "rollback to savepoint s1"); err != nil {
					t.Fatalf("rollback to savepoint after refusals: %v", err)
				}
				if _, err := tx.ExecContext(ctx, "release savepoint s1"); err != nil {
					t.Fatalf("release: %v", err)
				}
				if err := tx.QueryRowContext(ctx, "select n from acc where id = 1").Scan(&n); err != nil || n != 1 {
					t.Fatalf("after refusals: %v %d", err, n)
				}
				if err := tx.Commit(); err != nil {
					t.Fatalf("commit after refusals: %v", err)
				}
				if err := db.QueryRowContext(ctx, "select count(*) from acc").Scan(&n); err != nil || n != 1 {
					t.Fatalf("committed rows: %v %d", err, n)
				}
			})
		}
	}
	for _, b := range c.Snapshot().Budgets {
		if b.InFlight != 0 {
			t.Errorf("budget %s in flight %d", b.Name, b.InFlight)
		}
	}
}

// A refused statement is decided once: database/sql never retries it on another connection.
func TestSQLBlockedNotRetried(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: closed, mode: enforce, max_concurrent: 0}
rules:
  - {budget: closed, match: {app: closed}}
`)
	db.SetMaxOpenConns(3)
	ctx := tagging.With(context.Background(), "app", "closed")
	st, err := db.PrepareContext(context.Background(), "select $1::int")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	calls := []func() error{
		func() error { _, err := db.ExecContext(ctx, "select 1"); return err },
		func() error { _, err := db.QueryContext(ctx, "select 1"); return err },
		func() error { var n int; return db.QueryRowContext(ctx, "select 1").Scan(&n) },
		func() error { _, err := st.ExecContext(ctx, 1); return err },
		func() error { _, err := st.QueryContext(ctx, 1); return err },
		func() error { _, err := tx.ExecContext(ctx, "select 1"); return err },
		func() error { _, err := tx.StmtContext(ctx, st).QueryContext(ctx, 1); return err },
		func() error { _, err := conn.ExecContext(ctx, "select 1"); return err },
	}
	for i, f := range calls {
		before := budgetStatus(t, c, "closed").Blocked
		asBlocked(t, f())
		if d := budgetStatus(t, c, "closed").Blocked - before; d != 1 {
			t.Errorf("call %d decided %d times", i, d)
		}
	}
}

// Prepared statements reused from many goroutines across connections: every slot comes back,
// every statement is admitted or refused with a BlockedError.
func TestSQLPreparedManyGoroutines(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: b, mode: enforce, max_concurrent: 2, max_wait: 20ms, max_queue: 2}
rules:
  - {budget: b, match: {app: x}}
`)
	db.SetMaxOpenConns(6)
	ctx := tagging.With(context.Background(), "app", "x")
	st, err := db.PrepareContext(context.Background(), "select g, $1::text from generate_series(1, $2::int) g")
	if err != nil {
		t.Fatal(err)
	}
	var ok, blocked atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				var err error
				switch i % 3 {
				case 0:
					var rows *sql.Rows
					rows, err = st.QueryContext(ctx, "a", 50)
					if err == nil {
						n := 0
						for rows.Next() {
							n++
						}
						err = rows.Err()
						rows.Close()
						if err == nil && n != 50 {
							t.Errorf("rows %d", n)
						}
					}
				case 1:
					var res sql.Result
					res, err = st.ExecContext(ctx, "b", 7)
					if err == nil {
						if n, _ := res.RowsAffected(); n != 7 {
							t.Errorf("RowsAffected %d", n)
						}
					}
				case 2:
					var a int
					var s string
					err = st.QueryRowContext(ctx, fmt.Sprint(g), 1).Scan(&a, &s)
				}
				if err == nil {
					ok.Add(1)
				} else if errors.Is(err, pgtdriver.ErrBlocked) {
					blocked.Add(1)
				} else {
					t.Errorf("unexpected %v", err)
				}
			}
		}()
	}
	wg.Wait()
	st.Close()
	b := budgetStatus(t, c, "b")
	if b.InFlight != 0 || b.Waiting != 0 {
		t.Fatalf("after: %+v", b)
	}
	if int64(b.Admitted) != ok.Load() || int64(b.Blocked) != blocked.Load() {
		t.Fatalf("status admitted %d blocked %d, observed ok %d blocked %d", b.Admitted, b.Blocked, ok.Load(), blocked.Load())
	}
	if db.Stats().InUse != 0 {
		t.Fatalf("in use %d", db.Stats().InUse)
	}
}

// Rows closed late hold their slot; QueryRow with no rows gives it back; cancelling mid-iteration
// gives it back.
func TestSQLRowsLifecycle(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: b, mode: enforce, max_concurrent: 1}
rules:
  - {budget: b, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	var n int
	for range 3 {
		if err := db.QueryRowContext(ctx, "select 1 where false").Scan(&n); !errors.Is(err, sql.ErrNoRows) {
			t.Fatalf("no rows: %v", err)
		}
	}
	if b := budgetStatus(t, c, "b"); b.InFlight != 0 {
		t.Fatalf("after ErrNoRows: %+v", b)
	}
	rows, err := db.QueryContext(ctx, "select g from generate_series(1, 100000) g")
	if err != nil {
		t.Fatal(err)
	}
	rows.Next()
	_, err = db.ExecContext(ctx, "select 1")
	asBlocked(t, err)
	rows.Close()
	if _, err := db.ExecContext(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	// cancel mid-iteration
	cctx, cancel := context.WithCancel(ctx)
	rows, err = db.QueryContext(cctx, "select g from generate_series(1, 1000000) g")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; rows.Next(); i++ {
		if i == 10 {
			cancel()
		}
	}
	if !errors.Is(rows.Err(), context.Canceled) {
		t.Logf("rows.Err after cancel: %v", rows.Err())
	}
	rows.Close()
	if !eventually(5*time.Second, func() bool { return budgetStatus(t, c, "b").InFlight == 0 }) {
		t.Fatalf("slot not back after cancel: %+v", budgetStatus(t, c, "b"))
	}
	if err := db.QueryRowContext(ctx, "select 5").Scan(&n); err != nil || n != 5 {
		t.Fatalf("after cancel: %v", err)
	}
	// Ping after errors.
	if err := db.PingContext(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
}

// NULLs, named and ordinal args, custom Valuers, pgx.NamedArgs, under a cost budget (EXPLAIN
// with the arguments) and outside one, give what raw pgx gives.
type tenfoldValuer struct{ v int }

func (r tenfoldValuer) Value() (driver.Value, error) { return int64(r.v * 10), nil }

type ptrValuer struct{ s string }

func (r *ptrValuer) Value() (driver.Value, error) {
	if r == nil {
		return nil, nil
	}
	return r.s, nil
}

func TestSQLArgsUnderCostBudget(t *testing.T) {
	raw, _, dsn := openBoth(t)
	cfg, err := pgtdriver.ParseConfig([]byte(`
budgets:
  - {name: costly, mode: enforce, per_query_limit: 10s, server_share: 1, burst_limit: 100s, max_concurrent: 4}
rules:
  - {budget: costly, match: {app: costly}}
`))
	if err != nil {
		t.Fatal(err)
	}
	pgt, err := pgtdriver.Open(dsn, pgtdriver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer pgt.Close()
	ctx := tagging.With(context.Background(), "app", "costly")
	var nilPtr *ptrValuer
	cases := []struct {
		q    string
		args []any
	}{
		{"select $1::int, $2::text", []any{nil, nil}},
		{"select $1::int, $2::text", []any{sql.Named("a", 5), sql.Named("b", "x")}},
		{"select $1::int8", []any{tenfoldValuer{4}}},
		{"select $1::text", []any{&ptrValuer{"hi"}}},
		{"select $1::text", []any{nilPtr}},
		{"select $1::text", []any{sql.NullString{}}},
		{"select $1::int8", []any{sql.NullInt64{Int64: 3, Valid: true}}},
		{"select @a::int + @b::int", []any{pgx.NamedArgs{"a": 1, "b": 2}}},
		{"select $1::int", []any{pgx.QueryExecModeSimpleProtocol, 9}},
		{"select $1::bytea", []any{[]byte{1, 2, 3}}},
		{"select $1::timestamptz", []any{time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}},
	}
	for i, tc := range cases {
		want := collect(raw.QueryContext(context.Background(), tc.q, tc.args...))
		for j, db := range []*sql.DB{pgt} {
			for _, cx := range []context.Context{context.Background(), ctx} {
				got := collect(db.QueryContext(cx, tc.q, tc.args...))
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("case %d db %d: got %v want %v", i, j, got, want)
				}
			}
		}
	}
}
