package integration

import (
	"context"
	"testing"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestPoolVolatilePatternWaitsHoldingNoConn: the README's pool sizing rule says a
// driver.NewPool statement waiting for capacity (max_wait) holds no connection, except one whose
// cost needs an EXPLAIN, and that one waits holding it "only while its pattern is not costed:
// its first statements after a deploy, every one under explain: call"; the Pool's doc lists the
// same two cases. A budget in the default explain: auto also explains every call of a pattern
// whose measured cost varies widely (the README's EXPLAIN answer): a report whose duration
// depends on its arguments, exactly the noisy neighbour a budget exists for. Once such a
// pattern has run a few times, every one of its statements takes a pool connection before it is
// decided and, when the budget is full, waits for its slot holding that connection, for good:
// the reports waiting hold max_queue connections as on database/sql, which the sizing rule does
// not say. Here the budget's one slot is taken and a statement of a pattern that has run ten
// times waits for it: it should hold no connection while it waits.
func TestPoolVolatilePatternWaitsHoldingNoConn(t *testing.T) {
	p := pendingPool(t, 4, `budgets: [{name: b, mode: enforce, max_concurrent: 1, server_share: 1, burst_limit: 1000s, max_wait: 30s, max_queue: 4}]
rules: [{budget: b, match: {app: report}}]
`)
	ctx := tagging.With(context.Background(), "app", "report")
	// The report pattern runs ten times, its duration varying with its argument.
	for i := range 10 {
		secs := 0.0
		if i%2 == 1 {
			secs = 0.2
		}
		if _, err := p.Exec(ctx, "select pg_sleep($1)", secs); err != nil {
			t.Fatal(err)
		}
	}
	// Another report holds the budget's slot (and one connection) with its open rows.
	rows, err := p.Query(ctx, "select generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := p.Exec(ctx, "select pg_sleep($1)", 0.0); done <- err }()
	pendingEventually(t, "the report waits for the slot", func() bool { return poolBudget(t, p, "b").Waiting == 1 })
	held := p.Stat().AcquiredConns()
	rows.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if held != 1 {
		t.Errorf("%d pool connections acquired while a statement of a costed pattern waited for its slot, want 1 "+
			"(the open rows): the waiting statement holds one", held)
	}
}
