package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestPoolNewPatternRefusedBeforeConn: at a deploy every pattern is new, and its statements
// need an EXPLAIN on a connection to be priced; what refuses them whatever they cost must still
// refuse them before they take one. A reporting budget with a slot limit and a server_share
// has its slot taken; the application's pool (MaxConns 2) is busy: one connection with the
// running report, the other with uncontrolled work. A report of a pattern never seen arrives
// and its budget has no room for it (no slot, and no max_wait; or its queue full): it is
// refused at once, with a RetryAfter when the queue is full, and takes no connection, rather
// than waiting for one to EXPLAIN on until its context ends.
func TestPoolNewPatternRefusedBeforeConn(t *testing.T) {
	cases := []struct{ name, budget string }{
		{"no max_wait", `{name: r, mode: enforce, max_concurrent: 1, server_share: 0.5, burst_limit: 10s}`},
		{"queue full", `{name: r, mode: enforce, max_concurrent: 1, server_share: 0.5, burst_limit: 10s, max_wait: 20s, max_queue: 1}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := pendingPool(t, 2, "budgets: ["+c.budget+"]\nrules: [{budget: r, match: {app: r}}]\n")
			bg := context.Background()
			ctx := tagging.With(bg, "app", "r")
			// The running report: its slot, and one of the pool's connections.
			rows, err := p.Query(ctx, "select generate_series(1, 3)")
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			waiter := make(chan error, 1)
			if c.name == "queue full" {
				// A report of the same (now costed) pattern waits in the queue, holding no
				// connection: the queue (max_queue 1) is full.
				go func() { _, err := p.Exec(ctx, "select generate_series(1, 3)"); waiter <- err }()
				pendingEventually(t, "one waits", func() bool { return poolBudget(t, p, "r").Waiting == 1 })
			}
			// Uncontrolled work holds the other connection.
			conn, err := p.Acquire(bg)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			if n := p.Stat().AcquiredConns(); n != 2 {
				t.Fatalf("%d connections acquired, want the pool's 2", n)
			}
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			start := time.Now()
			_, err = p.Exec(cctx, "select count(*) from generate_series(1, 10) g where g > $1", 2)
			took := time.Since(start)
			var be *driver.BlockedError
			if !errors.As(err, &be) {
				t.Fatalf("a new pattern its budget refuses whatever it costs, the pool busy: got %v after %v, "+
					"want a *BlockedError at once (it waited for a connection to EXPLAIN on)", err, took.Round(time.Millisecond))
			}
			if c.name == "queue full" && be.RetryAfter <= 0 {
				t.Errorf("queue full: RetryAfter %v, want > 0", be.RetryAfter)
			}
			rows.Close()
			conn.Release()
			if c.name == "queue full" {
				if err := <-waiter; err != nil {
					t.Fatal(err)
				}
			}
			pendingEventually(t, "nothing left", func() bool {
				b := poolBudget(t, p, "r")
				return b.InFlight == 0 && b.Waiting == 0 && p.Stat().AcquiredConns() == 0
			})
		})
	}
}
