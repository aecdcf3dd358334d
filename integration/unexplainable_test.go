package integration

import (
	"context"
	"testing"
)

// TestUnexplainableStatements: statements whose EXPLAIN fails or means nothing
// (DDL, PREPARE/EXECUTE, parameters of unknown type, a volatile function with side effects,
// DO, SET, SHOW) run under an enforce budget that needs a cost, in and out of a transaction,
// exactly as without pgtraffic: no failure, no side effect twice.
func TestUnexplainableStatements(t *testing.T) {
	for _, mode := range []string{"call", "auto"} {
		t.Run(mode, func(t *testing.T) {
			c, db := openRules(t, `
budgets:
  - {name: b, mode: enforce, per_query_limit: 100s, server_share: 1, burst_limit: 100s, explain: `+mode+`}
rules:
  - {budget: b, match: {statement: select}}
  - {budget: b, match: {statement: insert}}
  - {budget: b, match: {statement: ddl}}
  - {budget: b, match: {statement: utility}}
  - {budget: b, match: {statement: other}}
`)
			ctx := context.Background()
			mustExec(t, db, ctx, `create table log (n int)`)
			mustExec(t, db, ctx, `create sequence s`)
			mustExec(t, db, ctx, `create function bump() returns int language sql volatile as $$ insert into log values (1) returning 1 $$`)
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			mustExec(t, tx, ctx, `create table t2 (a int)`)
			mustExec(t, tx, ctx, `prepare p (int) as insert into t2 values ($1)`)
			mustExec(t, tx, ctx, `execute p(1)`)
			mustExec(t, tx, ctx, `set local work_mem = '8MB'`)
			mustExec(t, tx, ctx, `do $$ begin perform nextval('s'); end $$`)
			if n := queryInt(t, tx, ctx, `select nextval('s')`); n != 2 {
				t.Fatalf("nextval %d, want 2", n)
			}
			if n := queryInt(t, tx, ctx, `select bump()`); n != 1 {
				t.Fatalf("bump %d", n)
			}
			if n := queryInt(t, tx, ctx, `select length($1)`, "abc"); n != 3 {
				t.Fatalf("length %d", n)
			}
			if n := queryInt(t, tx, ctx, `select count(*) from t2 where a = any($1)`, []int32{1, 2}); n != 1 {
				t.Fatalf("any %d", n)
			}
			if n := queryInt(t, tx, ctx, `select $1::int + $2`, 1, 2); n != 3 {
				t.Fatalf("sum %d", n)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if n := queryInt(t, db, ctx, `select count(*) from log`); n != 1 {
				t.Fatalf("the volatile function ran %d times, want 1", n)
			}
			if n := queryInt(t, db, ctx, `select count(*) from t2`); n != 1 {
				t.Fatalf("t2 has %d rows, want 1", n)
			}
			var s string
			if err := db.QueryRowContext(ctx, `show work_mem`).Scan(&s); err != nil {
				t.Fatal(err)
			}
			mustExec(t, db, ctx, `vacuum log`)
			mustExec(t, db, ctx, `analyze log`)
			for _, b := range c.Snapshot().Budgets {
				if b.Admitted < 15 || b.Blocked != 0 {
					t.Fatalf("budget %s admitted %d, blocked %d: the rules did not cover the statements", b.Name, b.Admitted, b.Blocked)
				}
			}
		})
	}
}
