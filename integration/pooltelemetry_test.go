package integration

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestPoolTelemetry: the pool's statements, its batches' and its copies get the spans and the
// decision counts of the database/sql driver, by the same names.
func TestPoolTelemetry(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	p, _ := openPool(t, `budgets: [{name: all, mode: enforce, max_concurrent: 4}]
rules: [{budget: all, match: {app: t}}]
guards: {require_where: enforce}
`, driver.WithTracerProvider(tp), driver.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	ctx := tagging.With(context.Background(), "app", "t")
	if _, err := p.Exec(ctx, "create table items (id int)"); err != nil {
		t.Fatal(err)
	}
	spans.Reset()
	var n int
	if err := p.QueryRow(tagging.With(ctx, "step", "row"), "select count(*) from items").Scan(&n); err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue("insert into items values (1)")
	b.Queue("select id from items")
	if err := p.SendBatch(tagging.With(ctx, "step", "batch"), b).Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.CopyFrom(tagging.With(ctx, "step", "copy"), pgx.Identifier{"items"}, []string{"id"},
		pgx.CopyFromRows([][]any{{2}})); err != nil {
		t.Fatal(err)
	}
	_, err := p.Exec(tagging.With(ctx, "step", "blocked"), "delete from items")
	asBlocked(t, err)

	got := spans.GetSpans()
	row := telSpan(t, got, "row")
	if row.Name != "SELECT items" || telAttr(row.Attributes, "pgtraffic.decision").AsString() != "allow" ||
		telAttr(row.Attributes, "db.query.text").AsString() == "" {
		t.Fatalf("row span %s %v", row.Name, row.Attributes)
	}
	var batch []string
	for _, s := range got {
		if telAttr(s.Attributes, "pgtraffic.tag.step").AsString() == "batch" {
			batch = append(batch, s.Name)
		}
	}
	if len(batch) != 2 || batch[0] != "INSERT items" || batch[1] != "SELECT items" {
		t.Fatalf("batch spans %q", batch)
	}
	cp := telSpan(t, got, "copy")
	if cp.Name != "COPY items" || telAttr(cp.Attributes, "pgtraffic.tag.statement").AsString() != "copy" ||
		telAttr(cp.Attributes, "pgtraffic.tag.table").AsString() != "items" {
		t.Fatalf("copy span %s %v", cp.Name, cp.Attributes)
	}
	if bl := telSpan(t, got, "blocked"); telAttr(bl.Attributes, "pgtraffic.decision").AsString() != "block" {
		t.Fatalf("blocked span %v", bl.Attributes)
	}
	s := &telSetup{reader: reader}
	if _, ok := s.metrics(t)["pgtraffic.decisions"]; !ok {
		t.Fatal("no pgtraffic.decisions")
	}
}
