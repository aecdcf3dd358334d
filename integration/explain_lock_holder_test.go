package integration

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestLockHolderNotHeldByAnExplainItBlocks: the README's cost step: "Inside a
// transaction the EXPLAIN's savepoint leaves the transaction usable", and its deploy rule that
// statements of a pattern that arrive while the pattern's EXPLAIN is on its way wait for that
// EXPLAIN ("a few per pattern at a deploy", "the statements of a new pattern waiting for its
// first EXPLAIN (one round trip, or as long as that EXPLAIN waits on a lock)"). An EXPLAIN
// never failing or altering the caller's query is the contract of the cost step.
//
// A transaction takes a table's lock (a migration, a TRUNCATE-and-reload, LOCK TABLE); a request
// elsewhere runs a pattern over that table that is not costed yet (new at a deploy, or its plan
// just expired, which happens once a minute for every hot pattern under explain: pattern or
// auto): its EXPLAIN waits for the transaction's lock. The transaction then runs the same
// pattern itself. Without pgtraffic it runs at once (it holds the lock), and so it must with
// it: waiting for the other session's EXPLAIN, which waits for the transaction, would be a
// deadlock the server cannot see, broken only by the transaction's context (5 s here; never
// without a deadline). Both front ends.
func TestLockHolderNotHeldByAnExplainItBlocks(t *testing.T) {
	for _, front := range []string{"Open", "NewPool"} {
		t.Run(front, func(t *testing.T) {
			ctx := context.Background()
			dsn := pgtest.Shared(t).CreateDatabase(t)
			raw := openRaw(t, dsn)
			mustExec(t, raw, ctx, `create table dl (id int primary key, v int)`)
			mustExec(t, raw, ctx, `insert into dl select g, g from generate_series(1, 1000) g`)
			rules := `
budgets:
  - {name: b, mode: enforce, per_query_limit: 100s, explain: pattern}
rules:
  - {budget: b, match: {app: x}}
`
			x := tagging.With(ctx, "app", "x")
			const q = `select count(*) from dl where id > $1`
			var other func() error                                          // the request elsewhere
			var inTx func(ctx context.Context, q string, args ...any) error // in the lock holder's transaction
			var rollback func()
			switch front {
			case "Open":
				_, db := openSizedDB(t, dsn, 4, driver.WithConfig(poolRules(t, rules)))
				tx, err := db.BeginTx(x, nil)
				if err != nil {
					t.Fatal(err)
				}
				rollback = func() { tx.Rollback() }
				inTx = func(ctx context.Context, q string, args ...any) error {
					_, err := tx.ExecContext(ctx, q, args...)
					return err
				}
				other = func() error { _, err := db.ExecContext(x, q, 5); return err }
			case "NewPool":
				p := openPoolAt(t, dsn, rules)
				tx, err := p.Begin(x)
				if err != nil {
					t.Fatal(err)
				}
				rollback = func() { tx.Rollback(ctx) }
				inTx = func(ctx context.Context, q string, args ...any) error { _, err := tx.Exec(ctx, q, args...); return err }
				other = func() error { _, err := p.Exec(x, q, 5); return err }
			}
			defer rollback()
			if err := inTx(x, `lock table dl in access exclusive mode`); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- other() }()
			mustEventually(t, "the other request's EXPLAIN waits for the transaction's lock", func() bool {
				return queryInt(t, raw, ctx, `select count(*) from pg_stat_activity where wait_event_type = 'Lock' and query like 'EXPLAIN%dl%'`) == 1
			})
			actx, cancel := context.WithTimeout(x, 5*time.Second)
			defer cancel()
			t0 := time.Now()
			err := inTx(actx, q, 7)
			took := time.Since(t0)
			rollback()
			if oerr := <-done; oerr != nil {
				t.Errorf("the other request, once the lock was released: %v", oerr)
			}
			if err != nil {
				t.Errorf("the lock holder's own statement %q, which the server would run at once: %v after %v, "+
					"waiting for another session's EXPLAIN that waits for this transaction's lock", q, err, took.Round(time.Millisecond))
			}
		})
	}
}
