package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// The README's rollout guide tells an operator to watch what a budget refuses
// (pgtraffic.decisions, the status page) and to give an enforce budget a max_wait so that a
// statement "waits for capacity rather than fail at once". In a web application the
// request's context usually has a deadline shorter than max_wait: a statement that waits for
// a slot then fails with context.DeadlineExceeded because the budget held it back.
//
// Such a statement is counted nowhere: not as admitted, not as blocked, not among the
// recent refusals, not in pgtraffic.decisions (its span has an error status but no
// pgtraffic.decision). During an incident every request of the budget can fail this way
// while Snapshot and the metrics report zero refusals, and the operator has no sign that
// pgtraffic is the cause. BudgetStatus documents Blocked as counting the statements the
// budget refused, "a statement that waited under max_wait counts once": one that waited
// and never ran should count there too (or under a reason of its own).
func TestSQLWaiterWhoseContextEndsIsCounted(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: reports, mode: enforce, max_concurrent: 1, max_wait: 10s}
rules:
  - {budget: reports, match: {app: reports}}
`)
	ctx := tagging.With(context.Background(), "app", "reports")
	held := make(chan error, 1)
	go func() { _, err := db.ExecContext(ctx, "select pg_sleep(3)"); held <- err }()
	deadline := time.Now().Add(10 * time.Second)
	for budgetStatus(t, c, "reports").InFlight != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the first statement never took the slot")
		}
		time.Sleep(5 * time.Millisecond)
	}

	const waiters = 3
	for range waiters {
		rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond) // a request's deadline
		_, err := db.ExecContext(rctx, "select 1")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a statement waiting for the slot past its deadline: %v", err)
		}
	}
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	b := budgetStatus(t, c, "reports")
	s := c.Snapshot()
	t.Logf("after %d statements held back until their context ended: admitted %d, blocked %d (%v), recent blocks %d, counters.Blocked %d",
		waiters, b.Admitted, b.Blocked, b.BlockedBy, len(s.RecentBlocks), s.Counters.Blocked)
	if b.Blocked < waiters && len(s.RecentBlocks) == 0 {
		t.Fatalf("%d statements failed because the budget held them back until their context ended, "+
			"but the budget counts %d blocked and lists no recent refusal", waiters, b.Blocked)
	}
}
