package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestQueueColdWaiterAdmittedWhenBucketHasRoom: README step 3: waiting statements "are
// admitted in arrival order, the moment a slot is released, the bucket has room or a health
// sample allows"; Known limitations, Cold start: a statement of a new pattern reserves "a
// slot's share of the burst ..., and while less room is left, its share of that room", so
// such a statement fits the moment the bucket has any room left.
//
// The bucket (burst 1s, draining 0.05 s/s, max_concurrent 2: a cold share of 1/3 s) is put
// past its burst by a slow statement. Check (a small statement of known cost) then says when
// the bucket has room. A statement of a new pattern that waits under max_wait should be
// admitted about then. It is admitted about 1/3 s ÷ 0.05 s/s = 6.7 s later: its denial's
// RetryAfter, the one timer it sleeps on (nothing signals a draining bucket), is computed for
// the full cold share (budget.check: need = reservation(room <= 0) = the whole unknown cost),
// not for the share of the room that would admit it, so the budget sits idle with room while
// it, and everyone queued behind it, waits.
func TestQueueColdWaiterAdmittedWhenBucketHasRoom(t *testing.T) {
	c, db := openRules(t, `
server_cores: 1
budgets:
  - {name: b, mode: enforce, max_concurrent: 2, server_share: 0.05, burst_limit: 1s, max_wait: 40s}
rules:
  - {budget: b, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	// A new pattern reserves 1/3 s, runs 1.3 s and is charged what it took: the debt ends
	// above the burst.
	if _, err := db.ExecContext(ctx, "select pg_sleep(1.3)"); err != nil {
		t.Fatal(err)
	}
	err := c.Check(ctx)
	var be *driver.BlockedError
	if !errors.As(err, &be) || be.Reason != driver.ReasonBudget {
		t.Fatalf("Check after the overrun: %v; want a refusal for the bucket", err)
	}
	roomIn := be.RetryAfter
	start := time.Now()
	if _, err := db.ExecContext(ctx, "select 42 as never_seen_before"); err != nil {
		t.Fatalf("the cold statement: %v", err)
	}
	waited := time.Since(start)
	t.Logf("bucket has room in %v (Check); the cold statement waited %v (debt %.3fs)", roomIn, waited,
		budgetStatus(t, c, "b").Debt)
	if waited > roomIn+2*time.Second {
		t.Errorf("the bucket had room after %v, but the waiting statement of a new pattern was admitted only after %v",
			roomIn, waited)
	}
}
