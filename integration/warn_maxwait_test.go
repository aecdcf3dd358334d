package integration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
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

// TestWarnThenEnforceBurst follows the rollout guide from warn to enforce with a workload that
// arrives in bursts: rounds of three reports of 1.3 s, 20 ms apart, under max_concurrent 2 and
// max_wait 1s. Enforce refuses the third report of each round (the two slots free together,
// after 1.3 s, past its max_wait), so warn mode, with the same limits and the same workload
// (one round first, from which the budget learns how long a report holds its slot), must warn
// about it. The budget goes from warn to enforce by SetConfig, keeping its state, as a reload
// of the rules file does.
func TestWarnThenEnforceBurst(t *testing.T) {
	rules := func(mode string) string {
		return fmt.Sprintf(`
budgets:
  - {name: reports, mode: %s, max_concurrent: 2, max_wait: 1s, max_queue: 4}
rules:
  - {budget: reports, match: {app: reports}}
`, mode)
	}
	for _, fe := range openFrontEnds(t, rules("warn"), 8) {
		t.Run(fe.name, func(t *testing.T) {
			ctx := tagging.With(context.Background(), "app", "reports")
			round := func() (refused int) {
				var wg sync.WaitGroup
				var mu sync.Mutex
				for range 3 {
					wg.Go(func() {
						err := fe.exec(ctx, "select pg_sleep(1.3)")
						if errors.Is(err, driver.ErrBlocked) {
							mu.Lock()
							refused++
							mu.Unlock()
						} else if err != nil {
							t.Error(err)
						}
					})
					time.Sleep(20 * time.Millisecond)
				}
				wg.Wait()
				return refused
			}
			round() // the budget learns how long a report holds its slot
			before := fe.budget("reports").Warned
			round()
			warned := fe.budget("reports").Warned - before
			if err := fe.setRules(rules("enforce")); err != nil {
				t.Fatal(err)
			}
			refused := round()
			t.Logf("warn: %d of 3 warned; enforce: %d of 3 refused", warned, refused)
			if refused == 0 {
				t.Fatal("enforce refused none of a round's three reports: the workload does not exercise max_wait")
			}
			if warned < uint64(refused) {
				t.Errorf("warn mode warned about %d of a round's reports, enforce refused %d of the same round", warned, refused)
			}
		})
	}
}
