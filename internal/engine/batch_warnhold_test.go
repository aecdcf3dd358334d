package engine

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestBatchWarnHold: a batch's hold in a warn budget is the hold its admission took (what it
// reserved, and when), released as a statement's is: the hold time it teaches the budget is the
// batch's own, so a statement that would then wait behind a slot held as briefly (max_wait) runs
// unwarned as a would-be waiter, as it does after a statement held that long; and a batch over
// the limit is such a would-be waiter too.
func TestBatchWarnHold(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: dry, mode: warn, max_concurrent: 1, max_wait: 1s, max_queue: 4}
rules:
  - {budget: dry, match: {app: r}}
`)
	ctx := tagging.With(context.Background(), "app", "r")
	var b Batch
	if err := e.BeginBatch(ctx, &b, nil, []string{"select 1", "select 2"}, nil); err != nil {
		t.Fatal(err)
	}
	clk.Advance(100 * time.Millisecond)
	b.Finish(ctx, nil)

	running, err := begin(e, ctx, "select 3")
	if err != nil {
		t.Fatal(err)
	}
	defer running.Finish(ctx, nil)
	x, err := begin(e, ctx, "select 4")
	if err != nil {
		t.Fatal(err)
	}
	defer x.Finish(ctx, nil)
	if x.Decision != DecisionAllow {
		t.Errorf("statement behind a slot whose holds took 100 ms (a batch's), max_wait 1s: decision %q reason %q, want allow (enforce would have it wait)",
			x.Decision, x.Reason)
	}
	var over Batch
	if err := e.BeginBatch(ctx, &over, nil, []string{"select 5"}, nil); err != nil {
		t.Fatal(err)
	}
	defer over.Finish(ctx, nil)
	if d := over.Execs[0].Decision; d != DecisionAllow {
		t.Errorf("batch behind the slot, with room in the would-be queue: decision %q reason %q, want allow", d, over.Execs[0].Reason)
	}
}
