package integration

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestShutTenantRefusedWhileExplainWaitsOnLock: a migration holds a lock on a table, so the
// EXPLAIN of a new pattern on it waits. A tenant shut off with max_concurrent: 0 (an incident's
// kill switch) is refused at once all the same, on both front ends: its statement of that
// pattern does not wait for the other tenant's EXPLAIN (it waited as long as the lock was
// held), and its statement of another new pattern sends no EXPLAIN of its own (on database/sql
// it waited on the lock too, holding its connection). Causal, not timed: each refusal comes
// while the lock is still held, the other tenant's statement still waiting.
func TestShutTenantRefusedWhileExplainWaitsOnLock(t *testing.T) {
	const rules = `
budgets:
  - {name: all, mode: enforce, server_share: 1, burst_limit: 30s, explain: pattern}
  - {name: shut, mode: enforce, max_concurrent: 0}
rules:
  - {budget: all, match: {app: x}}
  - {budget: shut, match: {app: x, tenant: "7"}}
`
	type front struct {
		exec     func(ctx context.Context, q string) error
		counters func() driver.Counters
	}
	fronts := map[string]func(t *testing.T, dsn string) front{
		"Open": func(t *testing.T, dsn string) front {
			var logs lockedBuffer
			c, db := openShared(t, dsn, rules, &logs)
			db.SetMaxOpenConns(3)
			return front{
				exec:     func(ctx context.Context, q string) error { _, err := db.ExecContext(ctx, q, 1); return err },
				counters: func() driver.Counters { return c.Snapshot().Counters },
			}
		},
		"NewPool": func(t *testing.T, dsn string) front {
			var logs lockedBuffer
			p := openSharedPool(t, dsn, rules, &logs)
			return front{
				exec:     func(ctx context.Context, q string) error { _, err := p.Exec(ctx, q, 1); return err },
				counters: func() driver.Counters { return p.Snapshot().Counters },
			}
		},
	}
	for name, open := range fronts {
		t.Run(name, func(t *testing.T) {
			dsn := pgtest.Shared(t).CreateDatabase(t)
			admin, err := sql.Open("pgx", dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close()
			if _, err := admin.Exec("create table t (a int)"); err != nil {
				t.Fatal(err)
			}
			f := open(t, dsn)
			ctx := context.Background()
			lock, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer lock.Close(ctx)
			migration, err := lock.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := migration.Exec(ctx, "lock table t in access exclusive mode"); err != nil {
				t.Fatal(err)
			}
			const q = "select count(*) from t where a > $1"
			open1 := tagging.With(ctx, "app", "x", "tenant", "1")
			shut := tagging.With(ctx, "app", "x", "tenant", "7")
			waiting := make(chan error, 1)
			go func() { waiting <- f.exec(open1, q) }()
			if !eventually(10*time.Second, func() bool { return f.counters().ExplainCacheMisses > 0 }) {
				t.Fatal("the open tenant's statement never asked for its EXPLAIN")
			}
			for _, sq := range []string{q, "select max(a) from t where a < $1"} {
				bounded, cancel := context.WithTimeout(shut, 20*time.Second)
				explains := f.counters().ExplainCalls
				err := f.exec(bounded, sq)
				cancel()
				if !errors.Is(err, driver.ErrBlocked) {
					t.Errorf("the shut tenant's %q while the lock is held: %v, want refused", sq, err)
				}
				select {
				case err := <-waiting:
					t.Fatalf("the open tenant's statement ended while the lock was held: %v", err)
				default:
				}
				if n := f.counters().ExplainCalls - explains; n != 0 {
					t.Errorf("the shut tenant's %q sent %d EXPLAINs, want none", sq, n)
				}
			}
			if err := migration.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-waiting; err != nil {
				t.Errorf("the open tenant's statement once the lock was released: %v", err)
			}
		})
	}
}

// TestBlockReachesStatementInItsExplain: under explain: call every statement EXPLAINs itself;
// with a migration's lock on its table each waits in its EXPLAIN. The on-call engineer blocks
// the pattern by its fingerprint (SetConfig, as the incident runbook says): the statements
// already in their EXPLAIN are refused then, on both front ends, not once the lock goes.
// Causal: each refusal comes while the lock is still held.
func TestBlockReachesStatementInItsExplain(t *testing.T) {
	const q = "select count(*) from t where a > $1"
	rules := func(block string) string {
		return `
budgets:
  - {name: all, mode: enforce, per_query_limit: 30s, explain: call}
  - {name: incident, mode: enforce, max_concurrent: 0}
rules:
  - {budget: all, match: {app: x}}
` + block
	}
	block := "  - {budget: incident, match: {fingerprint: " + driver.Fingerprint(q) + "}}\n"
	for _, name := range []string{"Open", "NewPool"} {
		t.Run(name, func(t *testing.T) {
			dsn := pgtest.Shared(t).CreateDatabase(t)
			ctx := context.Background()
			lock, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer lock.Close(ctx)
			if _, err := lock.Exec(ctx, "create table t (a int)"); err != nil {
				t.Fatal(err)
			}
			var logs lockedBuffer
			var exec func(ctx context.Context) error
			var setConfig func(*driver.Config) error
			if name == "Open" {
				c, db := openShared(t, dsn, rules(""), &logs)
				exec = func(ctx context.Context) error { _, err := db.ExecContext(ctx, q, 1); return err }
				setConfig = c.SetConfig
			} else {
				p := openSharedPool(t, dsn, rules(""), &logs)
				exec = func(ctx context.Context) error { _, err := p.Exec(ctx, q, 1); return err }
				setConfig = p.SetConfig
			}
			migration, err := lock.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer migration.Rollback(ctx)
			if _, err := migration.Exec(ctx, "lock table t in access exclusive mode"); err != nil {
				t.Fatal(err)
			}
			const n = 3
			out := make(chan error, n)
			tagged := tagging.With(ctx, "app", "x")
			for range n {
				go func() {
					bounded, cancel := context.WithTimeout(tagged, 20*time.Second)
					defer cancel()
					out <- exec(bounded)
				}()
			}
			admin, err := pgx.Connect(ctx, dsn) // pg_stat_activity is read once per transaction: not the migration's
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close(ctx)
			explaining := func() int {
				var k int
				if err := admin.QueryRow(ctx, `select count(*) from pg_stat_activity
					where wait_event_type = 'Lock' and query ilike 'explain%'`).Scan(&k); err != nil {
					t.Error(err)
				}
				return k
			}
			if !eventually(10*time.Second, func() bool { return explaining() == n }) {
				t.Fatalf("%d of the %d statements' EXPLAINs wait on the lock", explaining(), n)
			}
			cfg, err := driver.ParseConfig([]byte(rules(block)))
			if err != nil {
				t.Fatal(err)
			}
			if err := setConfig(cfg); err != nil {
				t.Fatal(err)
			}
			for range n {
				if err := <-out; !errors.Is(err, driver.ErrBlocked) {
					t.Errorf("a statement in its EXPLAIN when its pattern was blocked: %v, want refused while the lock is held", err)
				}
			}
		})
	}
}
