package driver_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// reloadFront is one front end under test: exec runs a statement, and the calls both share.
type reloadFront struct {
	exec func(ctx context.Context, q string) error
	set  func(cfg *driver.Config) error
	snap func() driver.Snapshot
}

// TestReloadReachesWaitingStatements, on both front ends against a real PostgreSQL: a
// statement waiting for the only slot (max_wait 30s) while another runs pg_sleep(3) is decided
// again when the rules change: refused at once when the budget is closed (max_concurrent: 0,
// the incident switch), admitted at once when the limit is raised. "At once" is judged by
// order, not by a time: the waiter's answer comes while the statement holding the slot still
// runs.
func TestReloadReachesWaitingStatements(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	cfg := func(maxConcurrent int) *driver.Config {
		return &driver.Config{
			Budgets: []driver.Budget{{Name: "b", Mode: driver.ModeEnforce, MaxConcurrent: new(maxConcurrent),
				MaxWait: driver.Duration(30 * time.Second)}},
			Rules: []driver.Rule{{Budget: "b", Match: map[string]string{"app": "x"}}},
		}
	}
	fronts := map[string]func(t *testing.T) reloadFront{
		"database/sql": func(t *testing.T) reloadFront {
			c, err := driver.NewConnector(dsn, driver.WithConfig(cfg(1)))
			if err != nil {
				t.Fatal(err)
			}
			db := sql.OpenDB(c)
			t.Cleanup(func() { db.Close() })
			return reloadFront{
				exec: func(ctx context.Context, q string) error { _, err := db.ExecContext(ctx, q); return err },
				set:  c.SetConfig, snap: c.Snapshot,
			}
		},
		"pool": func(t *testing.T) reloadFront {
			p, err := driver.NewPool(context.Background(), dsn, driver.WithConfig(cfg(1)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			return reloadFront{
				exec: func(ctx context.Context, q string) error { _, err := p.Exec(ctx, q); return err },
				set:  p.SetConfig, snap: p.Snapshot,
			}
		},
	}
	for name, open := range fronts {
		for _, tc := range []struct {
			name    string
			to      int
			refused bool
		}{{"closed", 0, true}, {"raised", 2, false}} {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				f := open(t)
				ctx := tagging.With(context.Background(), "app", "x")
				holder := make(chan error, 1)
				go func() { holder <- f.exec(ctx, "select pg_sleep(3)") }()
				// Running, not only admitted: a pool statement admitted while it waits for its
				// connection is decided again there when the rules were replaced meanwhile.
				eventually(t, "the holder runs", func() bool { return f.snap().InFlight == 1 })
				waiter := make(chan error, 1)
				go func() { waiter <- f.exec(ctx, "select 1") }()
				eventually(t, "the second statement waits", func() bool { return budgetOf(f.snap(), "b").Waiting == 1 })

				if err := f.set(cfg(tc.to)); err != nil {
					t.Fatal(err)
				}
				var err error
				select {
				case err = <-waiter:
				case err := <-holder:
					t.Fatalf("the holder ended (%v) before the waiter was decided again: the reload did not reach it", err)
				}
				var blocked *driver.BlockedError
				switch {
				case tc.refused && !errors.As(err, &blocked):
					t.Fatalf("waiter: %v; want refused by the closed budget", err)
				case tc.refused && blocked.Limit != "max_concurrent=0":
					t.Fatalf("waiter refused by %q; want max_concurrent=0", blocked.Limit)
				case !tc.refused && err != nil:
					t.Fatalf("waiter after the limit was raised: %v", err)
				}
				if err := <-holder; err != nil {
					t.Fatalf("holder: %v", err)
				}
				b := budgetOf(f.snap(), "b")
				if b.InFlight != 0 || b.Waiting != 0 {
					t.Fatalf("after both ended: %d in flight, %d waiting", b.InFlight, b.Waiting)
				}
			})
		}
	}
}

// budgetOf is budget name's status in s (the zero status when absent).
func budgetOf(s driver.Snapshot, name string) driver.BudgetStatus {
	for _, b := range s.Budgets {
		if b.Name == name {
			return b
		}
	}
	return driver.BudgetStatus{}
}
