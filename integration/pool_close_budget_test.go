package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
)

// poolPendingThenReload admits n pool statements pending (every connection of the pool is held
// by uncontrolled work), reloads the rules to newRules, gives the connections back and returns
// how many of the statements ran and how many were refused.
func poolPendingThenReload(t *testing.T, n int, newRules string) (ran, refused int) {
	t.Helper()
	p := pendingPool(t, int32(n), `budgets: [{name: b, mode: enforce, max_concurrent: 10}]
rules: [{budget: b, match: {app: x}}]
`)
	var raws []*pgxpool.Conn
	for range n {
		c, err := p.Raw().Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		raws = append(raws, c)
	}
	res := make(chan error, n)
	for range n {
		go func() { _, err := p.Exec(pendingCtx, "select pg_sleep(0.3)"); res <- err }()
	}
	pendingEventually(t, "all pending", func() bool { return poolBudget(t, p, "b").InFlight == n })
	if err := p.SetConfig(poolRules(t, newRules)); err != nil {
		t.Fatal(err)
	}
	for _, c := range raws {
		c.Release()
	}
	for range n {
		select {
		case err := <-res:
			var be *driver.BlockedError
			switch {
			case err == nil:
				ran++
			case errors.As(err, &be):
				refused++
			default:
				t.Errorf("unexpected: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a pending statement never ended")
		}
	}
	poolHoldsNothing(t, p, "after reload")
	return ran, refused
}

// Lowering max_concurrent from 10 to 1 while 3 pool statements are admitted and wait for a
// connection: at most 1 of them runs at once (Connect checks the new limit); the others are
// decided again (refused here: no max_wait).
func TestPoolLowerLimitWhilePending(t *testing.T) {
	ran, refused := poolPendingThenReload(t, 3, `budgets: [{name: b, mode: enforce, max_concurrent: 1}]
rules: [{budget: b, match: {app: x}}]
`)
	t.Logf("max_concurrent 10 -> 1: ran %d, refused %d", ran, refused)
	if ran > 1 {
		t.Errorf("after lowering max_concurrent to 1, %d pending statements ran", ran)
	}
}

// Closing the budget (max_concurrent: 0, the incident switch: "blocks what a rule matches")
// while 3 pool statements are admitted and wait for a connection: none runs. Each is decided
// again on its connection under the rules in force, which refuse it.
func TestPoolCloseBudgetWhilePending(t *testing.T) {
	ran, refused := poolPendingThenReload(t, 3, `budgets: [{name: b, mode: enforce, max_concurrent: 0}]
rules: [{budget: b, match: {app: x}}]
`)
	t.Logf("max_concurrent 10 -> 0: ran %d, refused %d", ran, refused)
	if ran > 0 {
		t.Errorf("after closing the budget (max_concurrent: 0), %d pending statements ran anyway "+
			"(lowering the limit to 1 lets only 1 run)", ran)
	}
}

// The same with the other incident switch, server_share: 0.
func TestPoolZeroShareWhilePending(t *testing.T) {
	ran, refused := poolPendingThenReload(t, 3, `budgets: [{name: b, mode: enforce, server_share: 0}]
rules: [{budget: b, match: {app: x}}]
`)
	t.Logf("server_share 0: ran %d, refused %d", ran, refused)
	if ran > 0 {
		t.Errorf("after closing the budget (server_share: 0), %d pending statements ran anyway", ran)
	}
}
