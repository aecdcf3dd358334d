package integration

// Helpers of the telemetry tests of the pool and of EXPLAIN failures: a pool with recording
// telemetry, its decision counts, its spans' warn events.

import (
	"strings"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// telPool opens a pgtraffic Pool with rules on a fresh database (pool_max_conns=maxConns
// unless empty), recording spans and metrics; the *telSetup holds only its metric reader.
func telPool(t *testing.T, maxConns string, rules string) (*driver.Pool, *tracetest.InMemoryExporter, *telSetup) {
	t.Helper()
	dsn := pgtest.Shared(t).CreateDatabase(t)
	if maxConns != "" {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + "pool_max_conns=" + maxConns
	}
	spans := tracetest.NewInMemoryExporter()
	reader := sdkmetric.NewManualReader()
	p := openPoolAt(t, dsn, rules,
		driver.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))),
		driver.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	return p, spans, &telSetup{reader: reader}
}

// telDecisions sums pgtraffic.decisions by "budget/decision/reason".
func telDecisions(t *testing.T, m map[string]metricdata.Metrics) map[string]int64 {
	out := map[string]int64{}
	mm, ok := m["pgtraffic.decisions"]
	if !ok {
		return out
	}
	for _, dp := range mm.Data.(metricdata.Sum[int64]).DataPoints {
		b, _ := dp.Attributes.Value("pgtraffic.budget")
		d, _ := dp.Attributes.Value("pgtraffic.decision")
		r, _ := dp.Attributes.Value("pgtraffic.reason")
		out[b.AsString()+"/"+d.AsString()+"/"+r.AsString()] += dp.Value
	}
	return out
}

// spanEvents is a span's pgtraffic.warn events, by the budget or guard each names.
type spanEvents struct{ events []string }

func telSpanEvents(spans tracetest.SpanStubs) []spanEvents {
	var out []spanEvents
	for _, sp := range spans {
		var se spanEvents
		for _, e := range sp.Events {
			if e.Name != "pgtraffic.warn" {
				continue
			}
			for _, kv := range e.Attributes {
				if kv.Key == "pgtraffic.budgets" {
					se.events = append(se.events, kv.Value.AsStringSlice()...)
				}
			}
		}
		out = append(out, se)
	}
	return out
}
