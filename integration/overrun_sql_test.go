package integration

import (
	"context"
	"database/sql/driver"
	"errors"
	"testing"
	"time"

	pgtdriver "github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

const overrunSQLRules = `
budgets:
  - {name: bounded, mode: enforce, max_duration: 300ms}
rules:
  - {budget: bounded, match: {app: reports}}
`

// overrunSQLIdle asserts the connector holds nothing: no statement in flight, none in the budget.
func overrunSQLIdle(t *testing.T, c *pgtdriver.Connector, step string) {
	t.Helper()
	if !eventually(3*time.Second, func() bool {
		return c.Snapshot().InFlight == 0 && budgetStatus(t, c, "bounded").InFlight == 0
	}) {
		t.Errorf("%s: in flight %d, budget in flight %d", step, c.Snapshot().InFlight, budgetStatus(t, c, "bounded").InFlight)
	}
}

func isOverrun(t *testing.T, step string, err error) {
	t.Helper()
	if !errors.Is(err, pgtdriver.ErrOverrun) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%s: error %T %v, want ErrOverrun and DeadlineExceeded", step, err, err)
	}
	if errors.Is(err, driver.ErrBadConn) {
		t.Errorf("%s: error matches driver.ErrBadConn", step)
	}
	if errors.Is(err, pgtdriver.ErrBlocked) {
		t.Logf("%s: note: overrun matches ErrBlocked", step)
	}
}

// An overrun through database/sql with one connection: the next statement runs (the connection
// pgx closed is replaced), nothing is left in flight.
func TestOverrunSQLExecThenReuse(t *testing.T) {
	c, db := openRules(t, overrunSQLRules)
	db.SetMaxOpenConns(1)
	ctx := tagging.With(context.Background(), "app", "reports")
	t0 := time.Now()
	_, err := db.ExecContext(ctx, "select pg_sleep(5)")
	isOverrun(t, "exec", err)
	if d := time.Since(t0); d > 3*time.Second {
		t.Errorf("exec returned after %v", d)
	}
	overrunSQLIdle(t, c, "exec")
	for i := range 3 {
		var n int
		if err := db.QueryRowContext(ctx, "select 1").Scan(&n); err != nil || n != 1 {
			t.Fatalf("statement %d after the overrun: %v", i, err)
		}
	}
	if n := budgetStatus(t, c, "bounded").BlockedBy["max_duration"]; n != 1 {
		t.Errorf("blocked_by max_duration %d, want 1", n)
	}
	overrunSQLIdle(t, c, "after")
}

// A prepared statement cut at its max_duration: database/sql's Stmt re-prepares on another
// connection, and the next execution runs.
func TestOverrunSQLPreparedStmt(t *testing.T) {
	c, db := openRules(t, overrunSQLRules)
	db.SetMaxOpenConns(1)
	ctx := tagging.With(context.Background(), "app", "reports")
	st, err := db.PrepareContext(ctx, "select pg_sleep($1::float8)::text")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rows, err := st.QueryContext(ctx, 5.0)
	if err == nil {
		for rows.Next() {
		}
		err = rows.Err()
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
	}
	isOverrun(t, "stmt query", err)
	overrunSQLIdle(t, c, "stmt query")
	_, err = st.ExecContext(ctx, 5.0)
	isOverrun(t, "stmt exec", err)
	overrunSQLIdle(t, c, "stmt exec")
	var s string
	if err := st.QueryRowContext(ctx, 0.01).Scan(&s); err != nil {
		t.Fatalf("prepared statement after two overruns: %v", err)
	}
	if n := budgetStatus(t, c, "bounded").BlockedBy["max_duration"]; n != 2 {
		t.Errorf("blocked_by max_duration %d, want 2", n)
	}
	overrunSQLIdle(t, c, "after")
}

// A statement in a transaction cut at its max_duration: the transaction is over (documented);
// the next statement in it fails, Rollback returns, the pool is usable, nothing in flight.
func TestOverrunSQLTx(t *testing.T) {
	c, db := openRules(t, overrunSQLRules)
	db.SetMaxOpenConns(1)
	ctx := tagging.With(context.Background(), "app", "reports")
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	_, err = tx.ExecContext(ctx, "select pg_sleep(5)")
	isOverrun(t, "tx exec", err)
	overrunSQLIdle(t, c, "tx exec")
	_, err2 := tx.ExecContext(ctx, "select 2")
	t.Logf("next statement in the tx: %T %v", err2, err2)
	if err2 == nil {
		t.Errorf("a statement after the overrun ran in the same transaction")
	}
	rerr := tx.Rollback()
	t.Logf("rollback: %v", rerr)
	overrunSQLIdle(t, c, "tx next")
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var n int
	if err := db.QueryRowContext(tctx, "select 3").Scan(&n); err != nil || n != 3 {
		t.Fatalf("after the transaction: %v", err)
	}
	overrunSQLIdle(t, c, "after")
}

// Rows whose app reads slowly (sleeps between rows past max_duration): either the rows end
// with an overrun, or they complete; never another error, never a slot left behind, and the
// connection is usable after.
func TestOverrunSQLSlowReader(t *testing.T) {
	c, db := openRules(t, overrunSQLRules)
	db.SetMaxOpenConns(1)
	ctx := tagging.With(context.Background(), "app", "reports")
	for _, q := range []string{
		"select g from generate_series(1, 5) g",
		"select repeat('x', 65536) from generate_series(1, 200) g",
	} {
		rows, err := db.QueryContext(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rows.Next() {
			n++
			if n <= 5 {
				time.Sleep(120 * time.Millisecond)
			}
		}
		err = rows.Err()
		cerr := rows.Close()
		t.Logf("%.40s: read %d rows, Err %v, Close %v", q, n, err, cerr)
		if err != nil {
			isOverrun(t, q, err)
		}
		overrunSQLIdle(t, c, q)
		var one int
		if err := db.QueryRowContext(ctx, "select 1").Scan(&one); err != nil {
			t.Fatalf("after slow rows: %v", err)
		}
	}
	t.Logf("budget: %+v", budgetStatus(t, c, "bounded"))
}
