package integration

import (
	"context"
	"errors"
	"maps"
	"testing"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestPoolBatchCountsMatchDecisionMetric: a pgx batch is decided whole, and each of its
// statements is one decision, in the budgets' counts as in the pgtraffic.decisions metric: a
// refused batch of three statements is three blocks of the budget that refused it. A zero
// limit refuses a batch with a statement it selects, as it refuses the statement alone.
func TestPoolBatchCountsMatchDecisionMetric(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	p, dsn := openPool(t, `
budgets:
  - {name: reporting, mode: enforce, max_concurrent: 1}
  - {name: tenants, mode: warn, max_concurrent: 1}
  - {name: frozen, mode: enforce, max_concurrent: 0}
rules:
  - {budget: reporting, match: {app: reporting}}
  - {budget: tenants, match: {app: web}}
  - {budget: frozen, match: {table: audit}}
`, driver.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	ctx := context.Background()
	if _, err := p.Exec(ctx, "create table items (id int); insert into items values (1), (2)"); err != nil {
		t.Fatal(err)
	}
	raw, err := pgx.Connect(ctx, dsn) // the frozen budget refuses every statement on audit
	if err != nil {
		t.Fatal(err)
	}
	_, err = raw.Exec(ctx, "create table audit (id int)")
	raw.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	batch := func(queries ...string) *pgx.Batch {
		b := &pgx.Batch{}
		for _, q := range queries {
			b.Queue(q)
		}
		return b
	}
	reporting := tagging.With(ctx, "app", "reporting")
	web := tagging.With(ctx, "app", "web")

	// reporting's one slot is held: a batch of three is refused.
	held, err := p.Query(reporting, "select id from items")
	if err != nil {
		t.Fatal(err)
	}
	if be := asBlocked(t, p.SendBatch(reporting, batch("select 1", "select id from items", "select 2")).Close()); be.Budget != "reporting" {
		t.Fatalf("refused by %s", be.Budget)
	}
	held.Close()
	if err := p.SendBatch(reporting, batch("select 1", "select 2")).Close(); err != nil {
		t.Fatal(err)
	}
	// tenants' one slot is held: a batch runs, each of its statements warned (enforce would
	// refuse each).
	held, err = p.Query(web, "select id from items")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SendBatch(web, batch("select 1", "select 2")).Close(); err != nil {
		t.Fatal(err)
	}
	held.Close()
	// The zero limit refuses a batch with a statement on audit.
	var be *driver.BlockedError
	if err := p.SendBatch(ctx, batch("select 1", "select count(*) from audit")).Close(); !errors.As(err, &be) ||
		be.Budget != "frozen" || be.Reason != driver.ReasonConcurrency {
		t.Errorf("a batch on audit: %v, want refused by frozen (concurrency)", err)
	}

	metric := decisionMetric(t, &telSetup{reader: reader})
	snap := p.Snapshot()
	want := map[string]int64{
		"reporting/allow/": 3, "reporting/block/concurrency": 3,
		"tenants/allow/": 1, "tenants/warn/concurrency": 2,
		"frozen/block/concurrency": 2,
	}
	if !maps.Equal(metric, want) {
		t.Errorf("metric %s, want %s", sortedKeys(metric), sortedKeys(want))
	}
	if got := statusCounts(snap); !maps.Equal(got, metric) {
		t.Errorf("status %s, metric %s: they must count alike", sortedKeys(got), sortedKeys(metric))
	}
	groups := map[string]int64{}
	for _, g := range snap.RecentBlocks {
		groups[g.Budget+"/"+g.Decision+"/"+g.Reason] += int64(g.Count)
	}
	if want := map[string]int64{"reporting/block/concurrency": 3, "tenants/warn/concurrency": 2,
		"frozen/block/concurrency": 2}; !maps.Equal(groups, want) {
		t.Errorf("recent refusal groups %s, want %s", sortedKeys(groups), sortedKeys(want))
	}
	if snap.Counters.Blocked != 5 {
		t.Errorf("summary %d blocked, want 5", snap.Counters.Blocked)
	}
}
