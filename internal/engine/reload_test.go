package engine

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestReloadRemovedBudgetKeepsState: a budget removed by one reload and re-added by the next,
// while a statement still holds its slot, finds its state again: max_concurrent: 1 does not run
// two. Removed and re-added with its debt not yet drained, it keeps the debt;
// once idle and drained, a reload forgets it.
func TestReloadRemovedBudgetKeepsState(t *testing.T) {
	const with = `
budgets:
  - {name: b, mode: enforce, max_concurrent: 1, server_share: 0.001, burst_limit: 1s}
  - {name: other, mode: enforce}
rules:
  - {budget: b, match: {app: b}}
`
	const without = `
budgets:
  - {name: other, mode: enforce}
`
	e, clk := newEngine(t, with)
	set := func(text string) {
		t.Helper()
		cfg, err := rules.Parse([]byte(text))
		if err != nil {
			t.Fatal(err)
		}
		if err := e.setConfig(cfg); err != nil {
			t.Fatal(err)
		}
	}
	ctx := tagging.With(context.Background(), "app", "b")
	// A trained pattern: this test is about reloads, not an untrained pattern's probe.
	p, _ := e.patterns.Get("select 1")
	e.model.Observe(p.FingerprintID, "", 0, 0, false, 1)
	hold, err := begin(e, ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	set(without)
	set(with)
	x, err := begin(e, ctx, "select 1")
	if err == nil {
		x.Finish(ctx, nil)
		t.Fatal("a budget removed and re-added lost its in-flight count: max_concurrent 1 admitted two")
	}
	if d := denial(t, err); d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("want a concurrency denial, got %v", d)
	}
	clk.Advance(900 * time.Millisecond)
	hold.Finish(ctx, nil) // 0.9s of debt against a 1s burst that drains 1ms per second

	set(without)
	set(with)
	if st := budgetSnapshot(t, e, "b"); st.InFlight != 0 || st.Debt < 0.8 {
		t.Fatalf("after release, removed and re-added: in flight %d, debt %.3f; want 0 and the 0.9s owed", st.InFlight, st.Debt)
	}
	clk.Advance(time.Hour) // the debt drains
	set(without)
	set(with)
	if st := budgetSnapshot(t, e, "b"); st.Decisions.Admitted != 0 {
		t.Fatalf("a drained, idle removed budget must be forgotten: it came back with %d admissions", st.Decisions.Admitted)
	}
}

func budgetSnapshot(t *testing.T, e *Engine, name string) BudgetState {
	t.Helper()
	for _, b := range e.Budgets() {
		if b.Name == name {
			return b
		}
	}
	t.Fatalf("no budget %q", name)
	return BudgetState{}
}
