package integration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestQueueRefusedAsFullBelowTheBound follows the README's rollout guide, step 3:
// "max_wait ... lets a statement wait for capacity rather than fail at once: waiting statements
// are admitted in arrival order, the moment a slot is released ..., and at most max_queue of them
// wait per budget and per per value (default: the budget's max_concurrent, else 8); one that
// finds the queue full is refused at once", and step 4's sizing rule: "One budget's statements
// then hold at most max_concurrent + max_queue connections".
//
// So workers that never have more than max_concurrent + max_queue statements outstanding
// together (each in a closed loop: one statement at a time) can never find the queue full, and
// under a max_wait far longer than the statements none is refused, with max_concurrent 1 and the
// default max_queue (1), two workers: a worker whose statement ends releases the slot, which
// wakes the other (waiting) worker's statement, and the first worker's next statement, arriving
// before that woken waiter has taken the slot and left the queue, must wait behind it rather
// than find the queue full of it. The same with max_queue 2 and three workers.
func TestQueueRefusedAsFullBelowTheBound(t *testing.T) {
	for _, tc := range []struct {
		maxQueue string // "" for the default (max_concurrent)
		workers  int    // max_concurrent (1) + max_queue
	}{{"", 2}, {", max_queue: 2", 3}} {
		rules := fmt.Sprintf(`
budgets:
  - {name: reports, mode: enforce, max_concurrent: 1, max_wait: 5s%s}
rules:
  - {budget: reports, match: {app: reports}}
`, tc.maxQueue)
		for _, fe := range openFrontEnds(t, rules, int32(tc.workers+2)) {
			t.Run(fmt.Sprintf("%s/workers=%d", fe.name, tc.workers), func(t *testing.T) {
				ctx := tagging.With(context.Background(), "app", "reports")
				var mu sync.Mutex
				var ran, refused int
				var first *driver.BlockedError
				var wg sync.WaitGroup
				for range tc.workers {
					wg.Go(func() {
						for range 15 {
							err := fe.exec(ctx, "select pg_sleep(0.02)")
							var be *driver.BlockedError
							mu.Lock()
							switch {
							case errors.As(err, &be):
								refused++
								if first == nil {
									first = be
								}
							case err != nil:
								t.Error(err)
							default:
								ran++
							}
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				t.Logf("%d workers, one statement each at a time, max_concurrent 1: %d ran, %d refused (first: %v)",
					tc.workers, ran, refused, first)
				if refused > 0 {
					t.Errorf("%d of %d statements refused, though at most max_concurrent + max_queue = %d were ever outstanding "+
						"and max_wait (5s) is far longer than a statement (20ms): %v", refused, ran+refused, tc.workers, first)
				}
			})
		}
	}
}

// TestQueueWarnModeWarnsBelowTheBound: the README's rollout guide, step 1: "With
// max_wait (step 3) a statement over a limit that enforce would make wait, its queue with room
// and its wait within max_wait, is not warned about: enforce would run it too." Two workers,
// each one statement at a time, under {max_concurrent: 1, max_wait: 3s} and the default
// max_queue (1): at most one statement is ever over the limit, a waiter for which the queue has
// room (max_concurrent + max_queue = 2 outstanding at most), its wait one 20 ms statement. A
// statement warn mode let run over the limit (a would-be waiter) counts against max_queue only
// until enforce would have admitted it, when a slot frees, not until it ends: none is warned.
func TestQueueWarnModeWarnsBelowTheBound(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: reports, mode: warn, max_concurrent: 1, max_wait: 3s}
rules:
  - {budget: reports, match: {app: reports}}
`)
	db.SetMaxOpenConns(4)
	ctx := tagging.With(context.Background(), "app", "reports")
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for range 15 {
				if _, err := db.ExecContext(ctx, "select pg_sleep(0.02)"); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	b := budgetStatus(t, c, "reports")
	t.Logf("warn mode, 2 workers, max_concurrent 1, default max_queue (1): admitted %d, warned %d %v", b.Admitted, b.Warned, b.WarnedBy)
	if b.Warned > 0 {
		t.Errorf("warn mode warned about %d of %d statements, though at most one was ever over max_concurrent, with room in its queue "+
			"and a wait of one 20 ms statement against max_wait 3s", b.Warned, b.Admitted+b.Warned)
	}
}
