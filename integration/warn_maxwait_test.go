package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestWarnModeUnderMaxWait follows the README's rollout guide: "Add the budget in mode: warn
// (the default) with the limits you intend. Nothing is blocked; what enforce would block is
// logged ..., counted in pgtraffic.decisions{decision="warn"}". The limits intended include
// max_wait, under which enforce makes a statement over max_concurrent wait for its slot and
// refuses it only once its queue is full (max_queue) or the wait outlasts max_wait. The same
// workload runs under the budget in enforce mode, then in warn mode: workers running short
// statements under max_concurrent 1, with a queue that holds every other worker (enforce
// blocks none, so warn mode must warn about none), then with more workers than the slot and
// the queue hold (enforce refuses some at once, and warn mode must warn about some).
func TestWarnModeUnderMaxWait(t *testing.T) {
	run := func(t *testing.T, mode string, workers, maxQueue int) (admitted, warned, blocked uint64) {
		c, db := openRules(t, fmt.Sprintf(`
budgets:
  - {name: reports, mode: %s, max_concurrent: 1, max_wait: 3s, max_queue: %d}
rules:
  - {budget: reports, match: {app: reports}}
`, mode, maxQueue))
		db.SetMaxOpenConns(workers)
		ctx := tagging.With(context.Background(), "app", "reports")
		var wg sync.WaitGroup
		errs := make(chan error, workers*5)
		for range workers {
			wg.Go(func() {
				for range 5 {
					if _, err := db.ExecContext(ctx, "select pg_sleep(0.03)"); err != nil && mode != "enforce" {
						errs <- err
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("%s: %v", mode, err)
		}
		b := budgetStatus(t, c, "reports")
		return b.Admitted, b.Warned, b.Blocked
	}
	for _, tc := range []struct {
		name              string
		workers, maxQueue int
	}{{"queue holds the rest", 4, 8}, {"queue full", 6, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			ea, ew, eb := run(t, "enforce", tc.workers, tc.maxQueue)
			wa, ww, wb := run(t, "warn", tc.workers, tc.maxQueue)
			t.Logf("enforce: admitted %d, warned %d, blocked %d; warn: admitted %d, warned %d, blocked %d", ea, ew, eb, wa, ww, wb)
			switch {
			case wb != 0:
				t.Errorf("warn mode blocked %d statements", wb)
			case eb == 0 && ww != 0:
				t.Errorf("warn mode warned about %d of %d statements as ones enforce would block; enforce, with the same limits and workload, blocked none", ww, wa)
			case eb > 0 && ww == 0:
				t.Errorf("enforce blocked %d statements; warn mode, with the same limits and workload, warned about none", eb)
			}
		})
	}
}
