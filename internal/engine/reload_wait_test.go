package engine

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestReloadReachesWaiters: a statement waiting for a slot (max_wait) when the rules change is
// decided again under the new rules at once, with the clock unmoved: not when the slot frees
// or its max_wait ends under the rules it was routed by. Closing the budget (max_concurrent:
// 0, the incident switch) refuses it; raising the limit, turning the budget to warn or off, or
// removing it admits it.
func TestReloadReachesWaiters(t *testing.T) {
	const before = `
budgets:
  - {name: q, mode: enforce, max_concurrent: 1, max_wait: 10s}
rules:
  - {budget: q, match: {app: q}}
`
	for _, tc := range []struct {
		name, after string
		refused     string // the reason the waiter is refused for; "": admitted
	}{
		{"closed", "budgets:\n  - {name: q, mode: enforce, max_concurrent: 0, max_wait: 10s}\nrules:\n  - {budget: q, match: {app: q}}\n",
			vocab.ReasonConcurrency},
		{"raised", "budgets:\n  - {name: q, mode: enforce, max_concurrent: 2, max_wait: 10s}\nrules:\n  - {budget: q, match: {app: q}}\n", ""},
		{"warn", "budgets:\n  - {name: q, mode: warn, max_concurrent: 1, max_wait: 10s}\nrules:\n  - {budget: q, match: {app: q}}\n", ""},
		{"off", "budgets:\n  - {name: q, mode: off, max_concurrent: 1}\nrules:\n  - {budget: q, match: {app: q}}\n", ""},
		{"removed", "budgets: []\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, clk := newEngine(t, before)
			ctx := tagging.With(context.Background(), "app", "q")
			b := e.state.Load().budgets[0].b // the budget q, whatever the reload makes of it
			hold, err := begin(e, ctx, "select 1")
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				x, err := begin(e, ctx, "select 1")
				if err == nil {
					x.Finish(ctx, nil)
				}
				done <- err
			}()
			waiting(t, clk, done)
			reload(t, e, tc.after)
			var got error
			select {
			case got = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the waiter was not decided again when the rules changed (the slot is still held, the clock unmoved)")
			}
			switch {
			case tc.refused == "" && got != nil:
				t.Fatalf("waiter refused under the new rules: %v", got)
			case tc.refused != "":
				if d := denial(t, got); d.Reason != tc.refused || d.Limit != "max_concurrent=0" {
					t.Fatalf("waiter: %+v; want refused for %s by the closed budget", d, tc.refused)
				}
			}
			hold.Finish(ctx, nil)
			if s := b.Snapshot(clk.Now()); s.Waiting != 0 || s.InFlight != 0 {
				t.Fatalf("budget q: %d waiting and %d in flight after every statement finished", s.Waiting, s.InFlight)
			}
		})
	}
}

// TestReloadReachesWaitingBatch: a batch waiting for its slot when the budget is closed
// (max_concurrent: 0) is refused at once under the new rules, every statement of it; a batch
// waiting when the budget is removed runs at once, holding nothing.
func TestReloadReachesWaitingBatch(t *testing.T) {
	for _, tc := range []struct {
		name, after string
		refused     bool
	}{
		{"closed", "budgets:\n  - {name: a, mode: enforce, max_concurrent: 0}\nrules:\n  - {budget: a, match: {app: x}}\n", true},
		{"removed", "budgets: []\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, clk := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1, max_wait: 10s}
rules:
  - {budget: a, match: {app: x}}
`)
			ctx := tagging.With(context.Background(), "app", "x")
			a := e.state.Load().budgets[0].b
			hold, err := begin(e, ctx, "select 1")
			if err != nil {
				t.Fatal(err)
			}
			var b Batch
			done := make(chan error, 1)
			go func() { done <- e.BeginBatch(ctx, &b, nil, []string{"select 2", "select 3"}, nil) }()
			waiting(t, clk, done)
			reload(t, e, tc.after)
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the batch was not decided again when the rules changed")
			}
			if tc.refused {
				if d := denial(t, err); d.Limit != "max_concurrent=0" {
					t.Fatalf("batch: %+v; want refused by the closed budget", d)
				}
				for i, x := range b.Execs {
					if x.Decision != DecisionBlock {
						t.Fatalf("statement %d of the refused batch: decision %q", i, x.Decision)
					}
				}
			} else {
				if err != nil {
					t.Fatalf("batch refused once its budget was removed: %v", err)
				}
				if len(b.holds) != 0 {
					t.Fatalf("batch holds %d requests of budgets since removed", len(b.holds))
				}
				b.Finish(ctx, nil)
			}
			hold.Finish(ctx, nil)
			if s := a.Snapshot(clk.Now()); s.Waiting != 0 || s.InFlight != 0 {
				t.Fatalf("budget a: %d waiting and %d in flight after every statement finished", s.Waiting, s.InFlight)
			}
		})
	}
}
