package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestLoweredMaxQueueShedsWaiters: a reload that lowers max_queue reaches the statements
// already waiting, as every reload does: decided again under the new rules, the first
// max_queue of them in arrival order keep their places and the others are refused (queue
// full, named by max_queue), so that the budget's waiters (each holding its connection under database/sql) are
// bounded by the new max_queue at once, not when their max_wait ends.
func TestLoweredMaxQueueShedsWaiters(t *testing.T) {
	const rulesFmt = `
budgets:
  - {name: q, mode: enforce, max_concurrent: 1, max_wait: 60s, max_queue: %s}
rules:
  - {budget: q, match: {app: q}}
`
	e, _ := newEngine(t, strings.Replace(rulesFmt, "%s", "4", 1))
	ctx := tagging.With(context.Background(), "app", "q")
	hold, err := begin(e, ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 4)
	for range 4 {
		go func() {
			x, err := begin(e, ctx, "select 1")
			if err == nil {
				x.Finish(ctx, nil)
			}
			done <- err
		}()
	}
	waitForWaiters(t, e, 4)
	reload(t, e, strings.Replace(rulesFmt, "%s", "1", 1))
	for range 3 {
		select {
		case err := <-done:
			// Put out of the queue by an earlier arrival rejoining, or finding it full when it
			// rejoins, a waiter is refused in the queue's name either way.
			if d := denial(t, err); d.Reason != vocab.ReasonConcurrency || d.Limit != "max_queue=1" {
				t.Fatalf("a waiter shed by the lowered max_queue: %+v, want refused for concurrency, max_queue=1", d)
			}
		case <-time.After(10 * time.Second): // a watchdog only
			t.Fatalf("%d still waiting after max_queue was lowered to 1", e.state.Load().budgets[0].b.Waiting(""))
		}
	}
	// The kept waiter is decided again under the new rules on its own goroutine: it may
	// rejoin the queue a moment after the others were refused.
	waitForWaiters(t, e, 1)
	hold.Finish(ctx, nil)
	if err := <-done; err != nil {
		t.Fatalf("the first waiter: %v", err)
	}
}
