package integration

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestPoolRefusedBeforeCostIsKnownCounted: a statement or batch of the pgx-native pool whose cost
// needs an EXPLAIN is first checked before it takes a connection, by what refuses it whatever it
// costs; one refused there is refused like any other, so BudgetStatus counts it ("one decision
// per statement, exactly as the pgtraffic.decisions metric counts them") and the status page's
// recent refusals list it. A cost budget's only slot is held by an open query; a statement of a
// pattern never seen is refused (concurrency), then a batch of two such statements (two
// blocks), and a batch whose learned cost is over per_query_limit with a statement not yet
// explained beside it (two blocks).
func TestPoolRefusedBeforeCostIsKnownCounted(t *testing.T) {
	p, _ := openPool(t, `budgets:
  - {name: b, mode: enforce, max_concurrent: 1, per_query_limit: 300ms}
rules:
  - {budget: b, match: {app: r}}
`)
	ctx := tagging.With(context.Background(), "app", "r")
	if _, err := p.Exec(ctx, "select pg_sleep(0.5)"); err != nil { // learned at 0.5 s
		t.Fatal(err)
	}
	refusedWith := func(err error, reason string) {
		t.Helper()
		var be *driver.BlockedError
		if !errors.As(err, &be) || be.Reason != reason {
			t.Fatalf("err %v, want a refusal with reason %s", err, reason)
		}
	}
	batch := func(qs ...string) error {
		b := &pgx.Batch{}
		for _, q := range qs {
			b.Queue(q)
		}
		return p.SendBatch(ctx, b).Close()
	}
	before := poolBudget(t, p, "b")

	rows, err := p.Query(ctx, "select generate_series(1, 3)") // the only slot
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Exec(ctx, "select 1 where 1 = 1")
	refusedWith(err, driver.ReasonConcurrency)
	refusedWith(batch("select 2 where 2 = 2", "select 3 where 3 = 3"), driver.ReasonConcurrency)
	rows.Close()
	refusedWith(batch("select pg_sleep(0.5)", "select 4 where 4 = 4"), driver.ReasonPerQuery)

	after := poolBudget(t, p, "b")
	if n := after.Blocked - before.Blocked; n != 5 {
		t.Errorf("blocked %d (by reason %v), want 5: 1 statement and 2 batches of 2 refused", n, after.BlockedBy)
	}
	recent := uint64(0)
	for _, g := range p.Snapshot().RecentBlocks {
		if g.Budget == "b" && g.Decision == "block" {
			recent += g.Count
		}
	}
	if recent != 5 {
		t.Errorf("recent refusals list %d statements of budget b, want 5", recent)
	}
}
