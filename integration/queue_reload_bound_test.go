package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestQueueReloadIntoSmallerQueueKeepsBound: README, step 3: "at most `max_queue` of them
// wait per budget and per `per` value"; step 4: under database/sql "One budget's statements
// then hold at most `max_concurrent + max_queue` connections"; CHANGELOG (Unreleased): a reload
// "now sheds the waiters beyond it ..., so the `max_concurrent + max_queue` bound on held
// connections holds from the reload on", and a reload decides every waiter again at once.
//
// Three statements wait, one per tenant, in their tenant's queues (per: tenant, max_concurrent
// 1, max_queue 1). A reload then sends those statements into one queue of bound 1: (a) the
// budget drops its per (an incident: throttle the budget as a whole), (b) the rule is moved to
// another budget with max_queue 1. After the reload at most one of them may wait there; the
// others must be refused. Today a statement decided again joins its new queue "in its place of
// arrival" without the bound being checked (budget.Join: w.arrival != 0), and no shed range
// covers a queue it did not wait in: all three wait, each holding a database/sql connection.
func TestQueueReloadIntoSmallerQueueKeepsBound(t *testing.T) {
	before := func() *driver.Config {
		return &driver.Config{
			Budgets: []driver.Budget{
				{Name: "b", Mode: driver.ModeEnforce, MaxConcurrent: new(1), Per: "tenant",
					MaxWait: driver.Duration(60 * time.Second), MaxQueue: new(1)},
				{Name: "incident", Mode: driver.ModeEnforce, MaxConcurrent: new(1),
					MaxWait: driver.Duration(60 * time.Second), MaxQueue: new(1)},
			},
			Rules: []driver.Rule{{Budget: "b", Match: map[string]string{"app": "x"}}},
		}
	}
	for _, tc := range []struct {
		name   string
		reload func(*driver.Config)
		target string
	}{
		{"per dropped", func(c *driver.Config) { c.Budgets[0].Per = "" }, "b"},
		{"rule moved", func(c *driver.Config) { c.Rules[0].Budget = "incident" }, "incident"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, db := openRules(t, "{}")
			if err := c.SetConfig(before()); err != nil {
				t.Fatal(err)
			}
			db.SetMaxOpenConns(20)
			// A fourth tenant's statement holds a slot throughout: in (a) the folded count is
			// past max_concurrent, so that each statement decided again waits or is refused.
			holdCtx := tagging.With(context.Background(), "app", "x", "tenant", "h")
			hold, err := db.QueryContext(holdCtx, "select 1")
			if err != nil {
				t.Fatal(err)
			}
			defer hold.Close()
			done := make(chan error, 3)
			var running []func()
			for _, tenant := range []string{"a", "b", "c"} {
				ctx := tagging.With(context.Background(), "app", "x", "tenant", tenant)
				rows, err := db.QueryContext(ctx, "select 1") // the tenant's one slot
				if err != nil {
					t.Fatal(err)
				}
				running = append(running, func() { rows.Close() })
				go func() { _, err := db.ExecContext(ctx, "select 2"); done <- err }()
			}
			defer func() {
				for _, r := range running {
					r()
				}
			}()
			if !eventually(10*time.Second, func() bool { return budgetStatus(t, c, "b").Waiting == 3 }) {
				t.Fatalf("%d waiting; want 3", budgetStatus(t, c, "b").Waiting)
			}
			cfg := before()
			tc.reload(cfg)
			if tc.target == "incident" {
				// Fill incident's one slot before the waiters are moved there: a budget that
				// admits nothing at the reload, as (a)'s folded slots do.
				fill := before()
				fill.Rules = append(fill.Rules, driver.Rule{Budget: "incident", Match: map[string]string{"app": "fill"}})
				if err := c.SetConfig(fill); err != nil {
					t.Fatal(err)
				}
				rows, err := db.QueryContext(tagging.With(context.Background(), "app", "fill"), "select 3")
				if err != nil {
					t.Fatal(err)
				}
				running = append(running, func() { rows.Close() })
				if !eventually(10*time.Second, func() bool { return budgetStatus(t, c, "b").Waiting == 3 }) {
					t.Fatalf("%d waiting after the fill; want 3", budgetStatus(t, c, "b").Waiting)
				}
			}
			if err := c.SetConfig(cfg); err != nil {
				t.Fatal(err)
			}
			refused := 0
			timeout := time.After(10 * time.Second)
		wait:
			for refused < 2 {
				select {
				case err := <-done:
					var be *driver.BlockedError
					if !errors.As(err, &be) {
						t.Fatalf("a waiter ended with %v while every slot is still held", err)
					}
					refused++
				case <-timeout:
					break wait
				}
			}
			if w := budgetStatus(t, c, tc.target).Waiting; refused < 2 || w > 1 {
				t.Errorf("after the reload into one queue of max_queue 1: %d statements wait in %q and %d were refused; "+
					"want at most 1 waiting and 2 refused", w, tc.target, refused)
			}
		})
	}
}
