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

// TestQueuePoolHealthWaitBoundedByMaxQueue: README, "Rolling out a budget" step 3:
// waiting statements "are admitted in arrival order, the moment ... a health sample allows,
// and at most `max_queue` of them wait per budget and per `per` value ...; one that finds the
// queue full is refused at once with a `RetryAfter`". Step 4 says a pool statement whose cost
// needs an EXPLAIN is first decided by "what refuses a statement whatever it costs (a health
// threshold ...)" before it takes a connection, and that one which must wait waits "at most
// `max_queue` per budget and value".
//
// The budget is throttled (in_flight: 1, one statement running), max_queue 1, max_wait 20s.
// Four pool statements arrive: with patterns already costed, one waits and three are refused
// at once (the control, which passes). With patterns not yet costed (the first statements
// after a deploy, under a server_share budget), every one of them waits: the health wait
// before the connection (engine precheck) joins no queue at all (its claim has no request),
// so max_queue bounds nothing, and the budget's Waiting says 0 while four statements wait.
func TestQueuePoolHealthWaitBoundedByMaxQueue(t *testing.T) {
	for _, costed := range []bool{true, false} {
		t.Run(fmt.Sprintf("costed=%v", costed), func(t *testing.T) {
			p, _ := openPool(t, `
budgets:
  - {name: b, mode: enforce, server_share: 0.5, max_wait: 20s, max_queue: 1, throttle_when: {in_flight: 1}}
rules:
  - {budget: b, match: {app: x}}
`)
			ctx := tagging.With(context.Background(), "app", "x")
			queries := make([]string, 4)
			for i := range queries {
				queries[i] = fmt.Sprintf("select %d as c%d", i, i)
				if costed {
					if _, err := p.Exec(ctx, queries[i]); err != nil {
						t.Fatal(err)
					}
				}
			}
			// One statement in flight (selecting no budget) reaches the threshold.
			sleeping := make(chan error, 1)
			go func() { _, err := p.Exec(context.Background(), "select pg_sleep(4)"); sleeping <- err }()
			if !eventually(10*time.Second, func() bool { return p.Snapshot().InFlight >= 1 }) {
				t.Fatal("the sleeping statement never ran")
			}
			type outcome struct {
				err  error
				took time.Duration
			}
			out := make(chan outcome, len(queries))
			var wg sync.WaitGroup
			for _, q := range queries {
				wg.Go(func() {
					start := time.Now()
					_, err := p.Exec(ctx, q)
					out <- outcome{err, time.Since(start)}
				})
			}
			// The refusals are at once; the waiter waits until the sleep ends (about 4 s).
			refused, waited := 0, 0
			var maxWaiting int
			deadline := time.After(30 * time.Second)
			for n := 0; n < len(queries); {
				select {
				case o := <-out:
					n++
					var be *driver.BlockedError
					switch {
					case errors.As(o.err, &be):
						refused++
						if be.RetryAfter <= 0 {
							t.Errorf("a refusal for a full queue without RetryAfter: %v", be)
						}
					case o.err == nil:
						waited++
					default:
						t.Errorf("unexpected error: %v", o.err)
					}
				case <-time.After(50 * time.Millisecond):
					maxWaiting = max(maxWaiting, poolBudget(t, p, "b").Waiting)
				case <-deadline:
					t.Fatal("statements still waiting after 30s")
				}
			}
			wg.Wait()
			<-sleeping
			if refused != 3 || waited != 1 {
				t.Errorf("max_queue 1 under a health throttle: %d statements waited and ran, %d refused at once; "+
					"want 1 and 3 (most the budget reported waiting at once: %d)", waited, refused, maxWaiting)
			}
		})
	}
}
