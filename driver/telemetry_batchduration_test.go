package driver

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgtraffic/pgtraffic/internal/engine"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestBatchDurationNotMultiplied: a pgx batch of 10 statements that takes 2 s on the
// wire is 2 s of database time. db.client.operation.duration must not record it as ten
// operations of 2 s each (20 s in all): the semantic conventions record a batch as one
// operation, and in any case the statements' durations must not sum to ten times the batch's.
func TestBatchDurationNotMultiplied(t *testing.T) {
	h := newTelHarness(t, "")
	ctx := tagging.With(context.Background(), "app", "batch")
	queries := make([]string, 10)
	for i := range queries {
		queries[i] = "SELECT id FROM items WHERE id = $1"
	}
	var b engine.Batch
	if err := h.eng.BeginBatch(ctx, &b, nil, queries, nil); err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(2 * time.Second) // the batch's round trip
	b.Finish(ctx, nil)

	var count uint64
	var sum float64
	for _, dp := range h.metrics(t)["db.client.operation.duration"].Data.(metricdata.Histogram[float64]).DataPoints {
		count += dp.Count
		sum += dp.Sum
		op, _ := dp.Attributes.Value("db.operation.name")
		size, _ := dp.Attributes.Value("db.operation.batch.size")
		if op.AsString() != "BATCH" || size.AsInt64() != int64(len(queries)) {
			t.Errorf("the batch's point: db.operation.name %q, db.operation.batch.size %d; want BATCH, %d",
				op.AsString(), size.AsInt64(), len(queries))
		}
	}
	if count != 1 {
		t.Errorf("%d points for one batch; want 1, the batch as one operation", count)
	}
	t.Logf("db.client.operation.duration: %d points, sum %.1fs for one batch of %d statements that took 2s", count, sum, len(queries))
	if sum > 2.001 {
		t.Errorf("a batch that took 2s recorded %.1fs of operation duration over %d points: each statement was charged the whole batch's time", sum, count)
	}
}
