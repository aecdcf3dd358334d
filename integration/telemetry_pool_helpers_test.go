package integration

// Helpers of the telemetry tests of the pool and of EXPLAIN failures: a pool with recording telemetry, its decision counts, a table lock.

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
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
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	if maxConns != "" {
		dsn += sep + "pool_max_conns=" + maxConns
	}
	cfg, err := driver.ParseConfig([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	spans := tracetest.NewInMemoryExporter()
	reader := sdkmetric.NewManualReader()
	p, err := driver.NewPool(context.Background(), dsn, driver.WithConfig(cfg),
		driver.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))),
		driver.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
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

// telLock takes an access exclusive lock on table, on a pgx connection of cc's, until the
// returned transaction ends (or the test).
func telLock(t *testing.T, cc *pgx.ConnConfig, table string) pgx.Tx {
	t.Helper()
	conn, err := pgx.ConnectConfig(context.Background(), cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	tx, err := conn.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(context.Background(), "lock table "+table+" in access exclusive mode"); err != nil {
		t.Fatal(err)
	}
	return tx
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
