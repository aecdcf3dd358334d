package integration

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// README: a statement on a held connection is never held up by pool statements still waiting
// for a connection, "so the two cannot wait for each other on a small pool". Under a
// server_share budget, the cost a pool statement reserves while it waits for the connection a
// transaction holds counted against the transaction's next statement, which then waited for a
// statement that waited for it, and was refused with nothing running. It runs now.
func TestPoolFrontPendingReservationHoldsUpHeldConn(t *testing.T) {
	p := pendingPool(t, 1, `server_cores: 1
budgets:
  - {name: warm, mode: enforce, server_share: 1, burst_limit: 100s}
  - {name: b, mode: enforce, server_share: 0.05, burst_limit: 1s, max_wait: 2s}
rules:
  - {budget: warm, match: {app: warm}}
  - {budget: b, match: {app: x}}
`)
	const q = "select pg_sleep(0.6)"
	warm := tagging.With(context.Background(), "app", "warm")
	for i := 0; i < 3; i++ { // the pattern's cost is learned under another budget
		if _, err := p.Exec(warm, q); err != nil {
			t.Fatal(err)
		}
	}
	ctx := pendingCtx
	tx, err := p.Begin(ctx) // the pool's only connection
	if err != nil {
		t.Fatal(err)
	}
	pend := make(chan error, 1)
	go func() { _, err := p.Exec(ctx, q); pend <- err }()
	pendingEventually(t, "the pool statement is admitted, pending", func() bool { return poolBudget(t, p, "b").InFlight == 1 })
	if d := poolBudget(t, p, "b").Debt; d < 0.5 || d > 1 {
		t.Skipf("reservation %.2f s: the learned cost is not what this test needs", d)
	}
	start := time.Now()
	_, err = tx.Exec(ctx, q)
	took := time.Since(start)
	tx.Rollback(context.Background())
	if perr := <-pend; perr != nil {
		t.Logf("pool statement: %v", perr)
	}
	if err != nil {
		t.Errorf("the transaction's statement, with nothing running in the budget, was held up %v by the cost "+
			"reserved by a pool statement that waits for the transaction's own connection, then refused: %v", took, err)
	}
}
