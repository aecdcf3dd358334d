package driver

import (
	"context"
	"slices"
	"testing"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestGuardWarnSpanNamesGuard: a statement that a warn-mode guard
// (require_where: warn) flags, and that an enforce budget with room admits without comment.
// The README's telemetry reference says a warned statement's span has a pgtraffic.warn event
// with pgtraffic.reason and pgtraffic.budgets, and the rollout guide says that what enforce
// would block is "counted in pgtraffic.decisions{pgtraffic.decision="warn"} and marked with a
// pgtraffic.warn span event". The metric counts the warning under pgtraffic.budget=require_where
// and an allow under the budget; the span must say the same: who warned is the guard. Today
// the event's pgtraffic.budgets lists only the enforce budget that allowed the statement, and
// neither the event nor the span names require_where anywhere, so a trace blames the wrong
// budget for a guard warning (a guard's block, by contrast, sets pgtraffic.budget to its name).
func TestGuardWarnSpanNamesGuard(t *testing.T) {
	h := newTelHarness(t, `
budgets:
  - name: orders-api
    mode: enforce
    max_concurrent: 10
rules:
  - budget: orders-api
    match: {app: api}
guards:
  require_where: warn
`)
	ctx := tagging.With(context.Background(), "app", "api")
	if _, err := h.db.ExecContext(ctx, "DELETE FROM orders"); err != nil {
		t.Fatal(err)
	}

	// The metric: the guard warned, the budget allowed.
	got := map[string]int64{}
	for _, dp := range h.metrics(t)["pgtraffic.decisions"].Data.(metricdata.Sum[int64]).DataPoints {
		b, _ := dp.Attributes.Value("pgtraffic.budget")
		d, _ := dp.Attributes.Value("pgtraffic.decision")
		got[b.AsString()+"/"+d.AsString()] += dp.Value
	}
	if got["require_where/warn"] != 1 || got["orders-api/allow"] != 1 {
		t.Fatalf("decisions %v, want require_where/warn and orders-api/allow", got)
	}

	sp := h.span(t, "DELETE orders", "api")
	if d := attrOf(sp.Attributes, "pgtraffic.decision").AsString(); d != "warn" {
		t.Fatalf("pgtraffic.decision = %q, want warn", d)
	}
	var warnBudgets [][]string
	for _, ev := range sp.Events {
		if ev.Name == "pgtraffic.warn" {
			warnBudgets = append(warnBudgets, attrOf(ev.Attributes, "pgtraffic.budgets").AsStringSlice())
		}
	}
	if len(warnBudgets) == 0 {
		t.Fatal("no pgtraffic.warn event")
	}
	named := attrOf(sp.Attributes, "pgtraffic.budget").AsString() == "require_where"
	for _, bs := range warnBudgets {
		if slices.Contains(bs, "require_where") {
			named = true
		}
		if slices.Equal(bs, []string{"orders-api"}) {
			t.Errorf("the pgtraffic.warn event names budgets %q, which allowed the statement (the metric counts orders-api/allow)", bs)
		}
	}
	if !named {
		t.Errorf("the span of a statement the require_where guard warned about never names require_where: "+
			"attributes %v, warn events' budgets %q", sp.Attributes, warnBudgets)
	}
}
