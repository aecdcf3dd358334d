package driver

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestTwoConnectorsMetricsKeptApart: an application with two connectors on one meter
// provider (the global one, by default: a primary and a replica, or a database/sql connector
// beside a Pool) must be able to tell their gauges and counters apart, or at least read their
// totals. pgtraffic.budget.in_flight, .debt and the other observable instruments carry only
// pgtraffic.budget (or no attribute at all), so both connectors' callbacks observe the same
// attribute set: the OpenTelemetry spec says callbacks should not make such duplicate
// observations, and the SDK keeps the last one: connector a's 3 statements in flight read as
// idle connector b's 0.
func TestTwoConnectorsMetricsKeptApart(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	const rules = `
budgets:
  - {name: reporting, mode: enforce, max_concurrent: 10}
rules:
  - {budget: reporting, match: {app: reporting}}
`
	a := newTelHarness(t, rules, WithMeterProvider(mp))
	_ = newTelHarness(t, rules, WithMeterProvider(mp)) // connector b
	ctx := tagging.With(context.Background(), "app", "reporting")
	// Connector a: three statements held in flight. Connector b: idle.
	for _, q := range []string{"SELECT id FROM a1", "SELECT id FROM a2", "SELECT id FROM a3"} {
		rows, err := a.db.QueryContext(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch m.Name {
			case "pgtraffic.budget.in_flight":
				var total int64
				for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
					total += dp.Value
					t.Logf("%s %v = %d", m.Name, dp.Attributes.ToSlice(), dp.Value)
				}
				if total != 3 {
					t.Errorf("%s: points sum to %d; connector a has 3 statements in flight, b none", m.Name, total)
				}
			}
		}
	}
}
