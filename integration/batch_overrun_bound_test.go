package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	pgtdriver "github.com/pgtraffic/pgtraffic/driver"
)

// rules.Budget.MaxDuration: "With several budgets the smallest bound applies; a pgx batch runs
// under the smallest bound of its statements". Snapshot/BudgetStatus: "A statement that ran
// past the budget's max_duration counts a second decision, as the metric does: Blocked with
// reason max_duration when enforce cancelled it". The README's reasons: "max_duration (a
// statement cancelled ... for running past its budget's max_duration)".
//
// A batch of two statements: a report that selects only budget "loose" (max_duration 10s) and
// an update that also selects "tight" (max_duration 300ms). The batch is cut at tight's 300 ms,
// as documented, and tight counts the block; "loose" counts none (its BlockedBy, its recent
// refusals, pgtraffic.decisions{pgtraffic.budget=loose, pgtraffic.reason=max_duration}, its log
// line "limit=max_duration=10s"): its 10 s bound cut nothing, and an operator reading such a
// block would think it too tight. As a single statement selecting both budgets is counted once,
// by the budget whose bound cut it.
func TestBatchCountsOnlyTheBoundThatCutIt(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	var logs lockedBuffer
	p, _ := openPool(t, `
budgets:
  - {name: loose, mode: enforce, max_duration: 10s}
  - {name: tight, mode: enforce, max_duration: 300ms}
rules:
  - {budget: loose, match: {app: x}}
  - {budget: tight, match: {app: x, statement: update}}
`, pgtdriver.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))), pgtdriver.WithLogger(logs.logger()))
	ctx := pendingCtx
	if _, err := p.Exec(ctx, "create table batch_bound (id int)"); err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue("select pg_sleep(2)")
	b.Queue("update batch_bound set id = 1 where id = 2")
	t0 := time.Now()
	err := p.SendBatch(ctx, b).Close()
	took := time.Since(t0)
	if !errors.Is(err, pgtdriver.ErrOverrun) || !strings.Contains(err.Error(), `"tight"`) {
		t.Fatalf("batch: %v, want an overrun of tight's bound", err)
	}
	t.Logf("batch cut after %v: %v", took, err)

	s := p.Snapshot()
	loose, tight := budgetIn(s, "loose"), budgetIn(s, "tight")
	t.Logf("tight blocked_by %v; loose blocked_by %v", tight.BlockedBy, loose.BlockedBy)
	if n := loose.BlockedBy[pgtdriver.ReasonMaxDuration]; n != 0 {
		t.Errorf("budget loose (max_duration 10s) counts %d max_duration blocks for a batch cut after %v by tight's 300ms", n, took.Round(time.Millisecond))
	}
	for _, rb := range s.RecentBlocks {
		if rb.Budget == "loose" {
			t.Errorf("recent refusals list loose blocking %q for %s", rb.Query, rb.Reason)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != "pgtraffic.decisions" || !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				bv, _ := dp.Attributes.Value(attribute.Key("pgtraffic.budget"))
				rv, _ := dp.Attributes.Value(attribute.Key("pgtraffic.reason"))
				if bv.AsString() == "loose" && rv.AsString() == pgtdriver.ReasonMaxDuration && dp.Value != 0 {
					t.Errorf("pgtraffic.decisions{budget=loose, reason=max_duration} = %d", dp.Value)
				}
			}
		}
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "budget=loose") && strings.Contains(line, "max_duration") {
			t.Logf("log: %s", line)
		}
	}
}
