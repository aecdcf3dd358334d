package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestQuarantineReachesWaiters: statements of a pattern wait (max_wait) for the slots of
// statements of the same pattern that overrun max_duration and quarantine it (after: 1). The
// waiters, admitted only once the quarantine began, are refused for it, none run: the strike
// is recorded before the slots go back. Before, a waiter woken by the release now and then ran
// in the gap and overran again (1 of 3 waiters, 1 of 8 with four slots, about one run in three).
func TestQuarantineReachesWaiters(t *testing.T) {
	for _, tc := range []struct{ slots, waiters int }{{1, 3}, {4, 8}} {
		rules := fmt.Sprintf(`budgets: [{name: b, mode: enforce, max_concurrent: %d, max_wait: 20s, max_queue: 8,
  max_duration: 400ms, quarantine: {after: 1, for: 1m}}]
rules: [{budget: b, match: {app: x}}]
`, tc.slots)
		for name, open := range openReloadFronts(rules) {
			t.Run(fmt.Sprintf("%d slots/%s", tc.slots, name), func(t *testing.T) {
				f := open(t)
				ctx := tagging.With(context.Background(), "app", "x")
				if err := f.exec(ctx, "select pg_sleep(0.01)"); err != nil { // a known cost: the pool decides before its connection
					t.Fatal(err)
				}
				running := make(chan error, tc.slots)
				for range tc.slots {
					go func() { running <- f.exec(ctx, "select pg_sleep(3)") }()
				}
				if !eventually(5*time.Second, func() bool { b, _ := budgetNamed(f.snap(), "b"); return b.InFlight == tc.slots }) {
					t.Fatal("the overrunning statements do not run")
				}
				waiting := make(chan error, tc.waiters)
				for range tc.waiters {
					go func() { waiting <- f.exec(ctx, "select pg_sleep(3)") }()
				}
				if !eventually(5*time.Second, func() bool { b, _ := budgetNamed(f.snap(), "b"); return b.Waiting == tc.waiters }) {
					t.Fatal("the waiters do not wait")
				}
				for range tc.slots {
					if err := <-running; !errors.Is(err, driver.ErrOverrun) {
						t.Fatalf("a statement past max_duration: %v", err)
					}
				}
				for range tc.waiters {
					select {
					case err := <-waiting:
						var be *driver.BlockedError
						if !errors.As(err, &be) || be.Reason != driver.ReasonQuarantine {
							t.Errorf("a waiter of the pattern quarantined while it waited: %v, want refused for quarantine", err)
						}
					case <-time.After(10 * time.Second):
						t.Fatal("a waiter hangs")
					}
				}
			})
		}
	}
}
