package integration

import (
	"context"
	"fmt"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestSpanManyTagsKeepsContractAttributes: a statement with 120 context tags fails on the
// server. Its span keeps error.type and db.response.status_code, which its end sets: a span
// carries at most 64 tag attributes, within the SDK's default of 128 attributes. Before,
// every tag was set when the span started, and the SDK dropped the attributes set at its end.
func TestSpanManyTagsKeepsContractAttributes(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	p, _ := openPool(t, "budgets: [{name: b, mode: enforce, max_concurrent: 8}]\nrules: [{budget: b, match: {app: x}}]\n",
		driver.WithTracerProvider(tp))
	ctx := tagging.With(context.Background(), "app", "x")
	for i := range 120 {
		ctx = tagging.With(ctx, fmt.Sprintf("k%03d", i), "v")
	}
	if _, err := p.Exec(ctx, "select 1/0"); err == nil {
		t.Fatal("select 1/0 succeeded")
	}
	got := spans.GetSpans()
	if len(got) != 1 {
		t.Fatalf("%d spans, want 1", len(got))
	}
	attrs := map[string]string{}
	for _, a := range got[0].Attributes {
		attrs[string(a.Key)] = a.Value.String()
	}
	for key, want := range map[string]string{"error.type": "22012", "db.response.status_code": "22012"} {
		if attrs[key] != want {
			t.Errorf("span attribute %s = %q, want %q (%d attributes, %d dropped)", key, attrs[key], want,
				len(got[0].Attributes), got[0].DroppedAttributes)
		}
	}
}
