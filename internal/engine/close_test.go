package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestCloseReachesWaiters: closing the engine (its Pool or Connector closes) answers the
// statements waiting for capacity with ErrClosed at once, with the clock unmoved, whatever
// they wait for (a slot, room in the bucket); one refused after the close is answered so
// without waiting; the statement running goes on and is finished as before.
func TestCloseReachesWaiters(t *testing.T) {
	for _, tc := range []struct{ name, rules string }{
		{"slot", `
budgets:
  - {name: q, mode: enforce, max_concurrent: 1, max_wait: 10s}
rules:
  - {budget: q, match: {app: q}}
`},
		{"bucket", `
server_cores: 1
budgets:
  - {name: q, mode: enforce, server_share: 0.5, burst_limit: 1s, max_wait: 10s}
rules:
  - {budget: q, match: {app: q}}
`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, clk := newEngine(t, tc.rules)
			ctx := tagging.With(context.Background(), "app", "q")
			hold, err := begin(e, ctx, "select 1")
			if err != nil {
				t.Fatal(err)
			}
			if tc.name == "bucket" {
				clk.Advance(3 * time.Second) // it ran 3 s: the bucket owes more than its burst of 1 s
				hold.Finish(ctx, nil)
			}
			done := make(chan error, 1)
			go func() {
				x, err := begin(e, ctx, "select now()") // a pattern not run yet: its cost is unknown
				if err == nil {
					x.Finish(ctx, nil)
				}
				done <- err
			}()
			waiting(t, clk, done)
			e.Close()
			select {
			case err := <-done:
				if !errors.Is(err, ErrClosed) {
					t.Fatalf("the waiter got %v; want ErrClosed", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the waiter still waits after Close (the clock unmoved)")
			}
			if _, err := begin(e, ctx, "select now()"); !errors.Is(err, ErrClosed) {
				t.Fatalf("a statement refused after Close got %v; want ErrClosed without waiting", err)
			}
			if tc.name == "slot" {
				hold.Finish(ctx, nil) // the running statement is finished as before
				x, err := begin(e, ctx, "select 1")
				if err != nil {
					t.Fatalf("a statement with room after Close: %v; want it admitted (the front end refuses it if closed)", err)
				}
				x.Finish(ctx, nil)
			}
		})
	}
}
