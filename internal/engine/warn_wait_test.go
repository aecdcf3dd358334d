package engine

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestWarnBudgetUnderMaxWait: a warn budget's warnings are what enforce would refuse. Under
// max_wait enforce refuses a statement only once its queue is full (max_queue) or its wait
// for room would outlast max_wait; the others wait and run. So in warn mode a statement over
// max_concurrent runs unwarned while the would-be queue has room and the wait (the slots over
// the limit, each a mean hold time) fits in max_wait, and is warned about, reason concurrency,
// otherwise.
func TestWarnBudgetUnderMaxWait(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: dry, mode: warn, max_concurrent: 1, max_wait: 1s, max_queue: 2}
rules:
  - {budget: dry, match: {app: r}}
`)
	ctx := tagging.With(context.Background(), "app", "r")
	const q = "select pg_sleep(0.1)"
	beginOK := func(what string) *Exec {
		t.Helper()
		x, err := begin(e, ctx, q)
		if err != nil {
			t.Fatalf("%s: a warn budget refused: %v", what, err)
		}
		return x
	}
	// A statement that ends teaches the budget a hold time of 100 ms.
	x := beginOK("first")
	clk.Advance(100 * time.Millisecond)
	x.Finish(ctx, nil)

	running := beginOK("in the slot")
	var waiters []*Exec
	for i := range 2 {
		w := beginOK("a would-be waiter")
		if w.Decision != DecisionAllow {
			t.Errorf("statement %d over max_concurrent with the would-be queue at %d of 2 and a wait of about %d00 ms: decision %q reason %q, want allow (enforce would have it wait)",
				i+2, i, i+1, w.Decision, w.Reason)
		}
		waiters = append(waiters, w)
	}
	full := beginOK("beyond the queue")
	if full.Decision != DecisionWarn || full.Reason != vocab.ReasonConcurrency {
		t.Errorf("statement with the would-be queue full: decision %q reason %q, want warn/concurrency (enforce would refuse it)", full.Decision, full.Reason)
	}
	full.Finish(ctx, nil)
	waiters[0].Finish(ctx, nil)
	if again := beginOK("after a would-be waiter ended"); again.Decision != DecisionAllow {
		t.Errorf("statement after a would-be waiter ended: decision %q reason %q, want allow", again.Decision, again.Reason)
	} else {
		again.Finish(ctx, nil)
	}
	waiters[1].Finish(ctx, nil)
	running.Finish(ctx, nil)

	// Statements that hold their slot for 10 s: a wait for the slot outlasts max_wait, and
	// enforce would refuse the statement after its second of waiting.
	for range 30 {
		x := beginOK("a long statement")
		clk.Advance(10 * time.Second)
		x.Finish(ctx, nil)
	}
	long := beginOK("a long statement in the slot")
	w := beginOK("waiting behind a long statement")
	if w.Decision != DecisionWarn || w.Reason != vocab.ReasonConcurrency {
		t.Errorf("statement behind one that holds its slot for 10 s, max_wait 1s: decision %q reason %q, want warn/concurrency", w.Decision, w.Reason)
	}
	w.Finish(ctx, nil)
	long.Finish(ctx, nil)
	if b := e.Budgets()[0]; b.InFlight != 0 {
		t.Errorf("budget with every statement finished: %d in flight, want 0", b.InFlight)
	}
}
