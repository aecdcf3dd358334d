package integration

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestExplainGetsTheArguments: the database/sql front end hands each statement's arguments to
// the engine's EXPLAIN as pgx would send them (positional values, pgx.NamedArgs rewritten, a
// leading QueryExecMode dropped), on every path: the connection's Exec and Query, a prepared
// statement's, in and out of a transaction. An EXPLAIN without its arguments fails ("there is no
// parameter $1") and would be counted as a failure.
func TestExplainGetsTheArguments(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: b, mode: enforce, per_query_limit: 1000s, explain: call}
rules:
  - {budget: b, match: {statement: select}}
  - {budget: b, match: {statement: update}}
`)
	ctx := context.Background()
	mustExec(t, db, ctx, `create table items (id int primary key, name text not null)`)
	mustExec(t, db, ctx, `insert into items select g, 'n' || g from generate_series(1, 100) g`)
	before := c.Snapshot().Counters

	one := func(name string, q func() (int, error), want int) {
		t.Helper()
		got, err := q()
		if err != nil || got != want {
			t.Fatalf("%s: %d, %v; want %d", name, got, err, want)
		}
	}
	scan := func(r *sql.Row) (int, error) {
		var n int
		err := r.Scan(&n)
		return n, err
	}
	const count = `select count(*) from items where id <= $1 and name like $2`
	one("query", func() (int, error) { return scan(db.QueryRowContext(ctx, count, 10, "n%")) }, 10)
	one("named args", func() (int, error) {
		return scan(db.QueryRowContext(ctx, `select count(*) from items where id <= @max`, pgx.NamedArgs{"max": 20}))
	}, 20)
	one("query exec mode", func() (int, error) {
		return scan(db.QueryRowContext(ctx, count, pgx.QueryExecModeSimpleProtocol, 30, "n%"))
	}, 30)
	one("exec", func() (int, error) {
		res, err := db.ExecContext(ctx, `update items set name = $1 where id <= $2`, "m", 5)
		if err != nil {
			return 0, err
		}
		n, err := res.RowsAffected()
		return int(n), err
	}, 5)
	st, err := db.PrepareContext(ctx, count)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	one("prepared query", func() (int, error) { return scan(st.QueryRowContext(ctx, 40, "n%")) }, 35)
	one("prepared exec", func() (int, error) {
		res, err := st.ExecContext(ctx, 50, "n%")
		if err != nil {
			return 0, err
		}
		n, err := res.RowsAffected()
		return int(n), err
	}, 1)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	one("in a transaction", func() (int, error) { return scan(tx.QueryRowContext(ctx, count, 60, "m%")) }, 5)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	after := c.Snapshot().Counters
	if calls := after.ExplainCalls - before.ExplainCalls; calls != 7 {
		t.Fatalf("EXPLAIN calls %d, want one per statement (7)", calls)
	}
	if failures := after.ExplainFailures - before.ExplainFailures; failures != 0 {
		t.Fatalf("%d EXPLAIN failures: a statement's arguments did not reach its EXPLAIN", failures)
	}
}
