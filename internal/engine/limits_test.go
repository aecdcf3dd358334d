package engine

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// A zero limit admits nothing that its rules match, with a zero RetryAfter, whatever max_wait
// says; statements the rules do not match run; omitted limits stay unlimited.
func TestZeroLimits(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: closed, mode: enforce, max_concurrent: 0, max_wait: 1s}
  - {name: dry, mode: enforce, server_share: 0}
  - {name: seen, mode: warn, max_concurrent: 0}
  - {name: open, mode: enforce}
rules:
  - {budget: closed, match: {app: a}}
  - {budget: dry, match: {app: b}}
  - {budget: seen, match: {app: c}}
  - {budget: open, match: {app: d}}
`)
	for _, tt := range []struct {
		app, budget, reason, limit string
	}{
		{"a", "closed", vocab.ReasonConcurrency, "max_concurrent=0"},
		{"b", "dry", vocab.ReasonBudget, "server_share=0"},
	} {
		ctx := tagging.With(context.Background(), "app", tt.app)
		d := denial(t, run(e, clk, ctx, "select 1", time.Millisecond))
		if d.Budget != tt.budget || d.Reason != tt.reason || d.Limit != tt.limit || d.RetryAfter != 0 ||
			d.Rule != "app="+tt.app || d.Fingerprint == "" {
			t.Errorf("app %s: denial %+v", tt.app, d)
		}
		if err := e.Check(ctx); err == nil {
			t.Errorf("app %s: Check admits what a zero limit refuses", tt.app)
		}
	}
	for _, app := range []string{"c", "d", "other"} {
		if err := run(e, clk, tagging.With(context.Background(), "app", app), "select 1", time.Millisecond); err != nil {
			t.Errorf("app %s: %v", app, err)
		}
	}
	counts := map[string][2]uint64{}
	for _, b := range e.Budgets() {
		counts[b.Name] = [2]uint64{b.Decisions.Blocked, b.Decisions.Warned}
	}
	if counts["closed"] != [2]uint64{1, 0} || counts["dry"] != [2]uint64{1, 0} || counts["seen"] != [2]uint64{0, 1} {
		t.Errorf("blocked, warned per budget: %v", counts)
	}
}
