package driver

import (
	"context"
	"fmt"
	"maps"
	"testing"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgtraffic/pgtraffic/internal/engine"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestStatusCountsMatchDecisionMetric runs statements past the concurrency limit of an enforce
// and a warn budget and compares each budget's counts in the Snapshot with the
// pgtraffic.decisions metric, per decision and reason. A warn budget's would-be refusals are
// warnings in both.
func TestStatusCountsMatchDecisionMetric(t *testing.T) {
	h := newTelHarness(t, telRules)
	for _, app := range []string{"reporting", "audit"} {
		ctx := tagging.With(context.Background(), "app", app)
		release := h.hold(t, ctx)
		for range 3 {
			_, _ = h.db.ExecContext(ctx, "SELECT 1 FROM items WHERE id = $1", 1)
		}
		release()
		_, _ = h.db.ExecContext(ctx, "SELECT 1 FROM items WHERE id = $1", 1)
	}
	metric, status := decisionCounts(t, h)
	want := map[string]int64{
		"reporting/allow/": 2, "reporting/block/concurrency": 3,
		"audit/allow/": 2, "audit/warn/concurrency": 3,
	}
	if !maps.Equal(metric, want) {
		t.Errorf("metric %v, want %v", metric, want)
	}
	if !maps.Equal(status, metric) {
		t.Errorf("status %v, metric %v: they must count alike", status, metric)
	}
}

// TestStatusCountsMatchDecisionMetricForBatches: a batch refused whole counts a block of the
// refusing budget for each of its statements, in the Snapshot as in the metric; a batch a warn
// budget would refuse counts a warning for each of its statements that the budget charges, as
// enforce would count a block for each, in both alike.
func TestStatusCountsMatchDecisionMetricForBatches(t *testing.T) {
	h := newTelHarness(t, telRules)
	for _, tt := range []struct {
		app     string
		queries []string
		refused bool
	}{
		{"reporting", []string{"SELECT 1", "SELECT 2", "SELECT 3"}, true},
		{"audit", []string{"SELECT 1", "SELECT 2"}, false},
	} {
		ctx := tagging.With(context.Background(), "app", tt.app)
		release := h.hold(t, ctx)
		var b engine.Batch
		err := h.eng.BeginBatch(ctx, &b, nil, tt.queries, nil)
		if refused := err != nil; refused != tt.refused {
			t.Fatalf("%s: BeginBatch = %v, refused %v", tt.app, err, tt.refused)
		}
		if err == nil {
			b.Finish(ctx, nil)
		}
		release()
	}
	metric, status := decisionCounts(t, h)
	want := map[string]int64{
		"reporting/allow/": 1, "reporting/block/concurrency": 3,
		"audit/allow/": 1, "audit/warn/concurrency": 2,
	}
	if !maps.Equal(metric, want) {
		t.Errorf("metric %v, want %v", metric, want)
	}
	if !maps.Equal(status, metric) {
		t.Errorf("status %v, metric %v: they must count alike", status, metric)
	}
}

// decisionCounts returns the pgtraffic.decisions metric and the Snapshot's per-budget counts,
// each as budget/decision/reason → count.
func decisionCounts(t *testing.T, h *telHarness) (metric, status map[string]int64) {
	t.Helper()
	metric = map[string]int64{}
	sum, ok := h.metrics(t)[metricDecisions].Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatal("no pgtraffic.decisions sum")
	}
	for _, dp := range sum.DataPoints {
		b, _ := dp.Attributes.Value(attrBudget)
		d, _ := dp.Attributes.Value(attrDecision)
		r, _ := dp.Attributes.Value(attrReason)
		metric[fmt.Sprintf("%s/%s/%s", b.AsString(), d.AsString(), r.AsString())] += dp.Value
	}
	status = map[string]int64{}
	for _, b := range h.conn.Snapshot().Budgets {
		if b.Admitted > 0 {
			status[b.Name+"/allow/"] = int64(b.Admitted)
		}
		for r, n := range b.WarnedBy {
			status[b.Name+"/warn/"+r] = int64(n)
		}
		for r, n := range b.BlockedBy {
			status[b.Name+"/block/"+r] = int64(n)
		}
	}
	return metric, status
}
