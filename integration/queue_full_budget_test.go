package integration

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestQueueFullRefusesAsItsBudget: a per-tenant budget {per: tenant,
// max_concurrent: 1, max_wait: 5s, max_queue: 6} beside a service-wide budget
// {max_concurrent: 3, max_wait: 5s} (max_queue defaults to 3). One tenant sends five
// statements at once: one runs, and the others wait for the tenant's slot. The tenant's queue
// (6) has room for all four, so the one refused at once is refused because the service-wide
// budget's queue is full. The README says "one that finds the queue full is refused at once
// with a RetryAfter", and BlockedError's doc says "Budget names the budget (or guard) that
// refused it": the refusal names budget "all", limit max_queue=3, and counts in its Blocked;
// named "tenant" (limit max_concurrent=1), it would send a user to raise the tenant budget's
// max_queue, which changes nothing (raising the service-wide budget's to 10 admits all five).
func TestQueueFullRefusesAsItsBudget(t *testing.T) {
	const rules = `budgets:
  - {name: tenant, mode: enforce, per: tenant, max_concurrent: 1, max_wait: 5s, max_queue: 6}
  - {name: all, mode: enforce, max_concurrent: 3, max_wait: 5s}
rules: [{budget: tenant, match: {app: x}}, {budget: all, match: {app: x}}]
`
	dsn := pgtest.Shared(t).CreateDatabase(t)
	type frontEnd struct {
		exec func(ctx context.Context, q string) error
		snap func() driver.Snapshot
	}
	open := map[string]func(t *testing.T) frontEnd{
		"sql": func(t *testing.T) frontEnd {
			cfg, err := driver.ParseConfig([]byte(rules))
			if err != nil {
				t.Fatal(err)
			}
			c, err := driver.NewConnector(dsn, driver.WithConfig(cfg))
			if err != nil {
				t.Fatal(err)
			}
			db := sql.OpenDB(c)
			db.SetMaxOpenConns(20)
			db.SetMaxIdleConns(20)
			t.Cleanup(func() { db.Close() })
			return frontEnd{func(ctx context.Context, q string) error { _, err := db.ExecContext(ctx, q); return err }, c.Snapshot}
		},
		"pool": func(t *testing.T) frontEnd {
			cfg, err := driver.ParseConfig([]byte(rules))
			if err != nil {
				t.Fatal(err)
			}
			p, err := driver.NewPool(context.Background(), dsn, driver.WithConfig(cfg))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			return frontEnd{func(ctx context.Context, q string) error { _, err := p.Exec(ctx, q); return err }, p.Snapshot}
		},
	}
	for _, name := range []string{"sql", "pool"} {
		t.Run(name, func(t *testing.T) {
			fe := open[name](t)
			ctx := tagging.With(context.Background(), "app", "x", "tenant", "noisy")
			var wg sync.WaitGroup
			errs := make([]error, 5)
			for i := range errs {
				wg.Add(1)
				go func() { defer wg.Done(); errs[i] = fe.exec(ctx, "select pg_sleep(0.4)") }()
			}
			wg.Wait()
			var refused []*driver.BlockedError
			for _, err := range errs {
				var be *driver.BlockedError
				if errors.As(err, &be) {
					refused = append(refused, be)
				} else if err != nil {
					t.Fatal(err)
				}
			}
			blocked := map[string]uint64{}
			for _, b := range fe.snap().Budgets {
				blocked[b.Name] = b.Blocked
			}
			for _, be := range refused {
				if be.Budget != "all" || be.Limit != "max_queue=3" {
					t.Errorf("%d of 5 refused; a refusal names budget %q (limit %s, reason %s, retry after %v), "+
						"though that budget's queue (max_queue 6) had room and the service-wide budget's (max_queue 3) was full; "+
						"blocked counts %v", len(refused), be.Budget, be.Limit, be.Reason, be.RetryAfter, blocked)
				}
			}
			// One runs, three wait in both queues, and the fifth finds the service-wide one full.
			if len(refused) == 0 || blocked["all"] != uint64(len(refused)) || blocked["tenant"] != 0 {
				t.Errorf("%d of 5 refused; blocked counts %v, want all's alone to count them", len(refused), blocked)
			}
		})
	}
}
