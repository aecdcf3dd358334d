package integration

import (
	"context"
	"maps"
	"testing"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgtraffic/pgtraffic/driver"
)

// TestBatchRefusedByGuardCountsAlike: a pgx batch of three statements whose
// second is a DELETE with no WHERE is refused whole by require_where: enforce (the README: one
// refused statement refuses the batch, and every result returns the *BlockedError). A user
// reading the status page and a dashboard of pgtraffic.decisions expects the two to count the
// refusal alike, as they do for a batch a budget refuses (each of its statements one block, in
// the recent refusals, the summary's blocked count and the metric). Today the metric counts
// three require_where blocks (one per statement of the batch) while the Snapshot's recent
// refusals and Counters.Blocked count one.
func TestBatchRefusedByGuardCountsAlike(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	p, _ := openPool(t, `
budgets:
  - {name: api, mode: enforce, max_concurrent: 10}
rules:
  - {budget: api, match: {app: api}}
guards:
  require_where: enforce
`, driver.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	ctx := context.Background()
	if _, err := p.Exec(ctx, "create table items (id int)"); err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue("select 1")
	b.Queue("delete from items")
	b.Queue("select id from items")
	if be := asBlocked(t, p.SendBatch(ctx, b).Close()); be.Budget != "require_where" {
		t.Fatalf("refused by %s, want require_where", be.Budget)
	}

	metric := decisionMetric(t, &telSetup{reader: reader})
	snap := p.Snapshot()
	groups := map[string]int64{}
	for _, g := range snap.RecentBlocks {
		groups[g.Budget+"/"+g.Decision+"/"+g.Reason] += int64(g.Count)
	}
	metricBlocks := map[string]int64{}
	var metricTotal int64
	for k, v := range metric {
		if k == "require_where/block/guard" {
			metricBlocks[k] = v
			metricTotal += v
		}
	}
	if !maps.Equal(groups, metricBlocks) {
		t.Errorf("recent refusal groups %s, metric %s: they must count alike", sortedKeys(groups), sortedKeys(metricBlocks))
	}
	if int64(snap.Counters.Blocked) != metricTotal {
		t.Errorf("status summary %d blocked, the metric %d require_where blocks", snap.Counters.Blocked, metricTotal)
	}
}
