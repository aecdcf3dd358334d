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

// TestCloseAnswersWaitingStatements, on both front ends against a real PostgreSQL: a statement
// waiting for the only slot (max_wait 30s) while another runs pg_sleep(3) returns ErrClosed
// when its Pool or its *sql.DB is closed, while the holder still runs (judged by order, not
// by a time), and the holder ends as usual.
func TestCloseAnswersWaitingStatements(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	cfg := &driver.Config{
		Budgets: []driver.Budget{{Name: "b", Mode: driver.ModeEnforce, MaxConcurrent: new(1),
			MaxWait: driver.Duration(30 * time.Second)}},
		Rules: []driver.Rule{{Budget: "b", Match: map[string]string{"app": "x"}}},
	}
	type front struct {
		exec     func(ctx context.Context, q string) error
		queryInt func(ctx context.Context, q string, n *int) error
		snap     func() driver.Snapshot
		close    func()
	}
	fronts := map[string]func(t *testing.T) front{
		"database/sql": func(t *testing.T) front {
			c, err := driver.NewConnector(dsn, driver.WithConfig(cfg))
			if err != nil {
				t.Fatal(err)
			}
			db := sql.OpenDB(c)
			t.Cleanup(func() { db.Close() })
			return front{
				exec: func(ctx context.Context, q string) error { _, err := db.ExecContext(ctx, q); return err },
				queryInt: func(ctx context.Context, q string, n *int) error {
					return db.QueryRowContext(ctx, q).Scan(n)
				},
				snap:  c.Snapshot,
				close: func() { db.Close() },
			}
		},
		"pool": func(t *testing.T) front {
			p, err := driver.NewPool(context.Background(), dsn, driver.WithConfig(cfg))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			return front{
				exec: func(ctx context.Context, q string) error { _, err := p.Exec(ctx, q); return err },
				queryInt: func(ctx context.Context, q string, n *int) error {
					return p.QueryRow(ctx, q).Scan(n)
				},
				snap:  p.Snapshot,
				close: p.Close, // returns once the holder has released its connection
			}
		},
	}
	for name, open := range fronts {
		t.Run(name, func(t *testing.T) {
			f := open(t)
			ctx := tagging.With(context.Background(), "app", "x")
			holder := make(chan error, 1)
			go func() { holder <- f.exec(ctx, "select pg_sleep(3)") }()
			eventually(t, "the holder runs on the server", func() bool {
				var n int
				err := f.queryInt(context.Background(), // untagged: no budget
					"select count(*) from pg_stat_activity where query = 'select pg_sleep(3)' and state = 'active'", &n)
				return err == nil && n == 1
			})
			waiter := make(chan error, 1)
			go func() { waiter <- f.exec(ctx, "select 1") }()
			eventually(t, "the second statement waits", func() bool { return budgetOf(f.snap(), "b").Waiting == 1 })

			go f.close()
			select {
			case err := <-waiter:
				if !errors.Is(err, driver.ErrClosed) {
					t.Fatalf("waiter: %v; want driver.ErrClosed", err)
				}
			case err := <-holder:
				t.Fatalf("the holder ended (%v) before the waiter was answered: the close did not reach it", err)
			}
			if err := <-holder; err != nil {
				t.Fatalf("holder: %v", err)
			}
		})
	}
}
