package integration

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestQueueBucketWaiterBehindMultiBudgetWaiter: waiting statements are admitted in arrival
// order the moment there is room (the bucket drained enough among others); README: "a
// statement arriving later takes only the room the ones ahead of it leave. In a budget that
// has room for it, a statement waiting for another budget holds only the slot and cost it
// needs".
//
// A report (budgets b and narrow) waits for narrow's only slot; in b, whose bucket has room,
// it holds only its small cost. A slow statement of b then puts b's bucket past its burst
// (1.3 s of a 1 s burst, draining 0.1 s/s). A statement of b alone arrives and waits for the
// bucket behind the report. The bucket has room for both (the report's cost and its own)
// about (debt − burst)/rate later; it should be admitted then, not at the end of its 40 s
// max_wait. (It is refused as queued behind the report, and nothing signals the bucket
// draining: it tries again at the RetryAfter of its refusal, when the bucket has room for it
// beside the report.)
func TestQueueBucketWaiterBehindMultiBudgetWaiter(t *testing.T) {
	const rules = `
server_cores: 1
budgets:
  - {name: b, mode: enforce, server_share: 0.1, burst_limit: 1s, max_wait: 40s}
  - {name: narrow, mode: enforce, max_concurrent: 1, max_wait: 60s}
rules:
  - {budget: b, match: {app: x}}
  - {budget: narrow, match: {lane: slow}}
`
	for _, fe := range openFrontEnds(t, rules, 8) {
		t.Run(fe.name, func(t *testing.T) {
			bg := context.Background()
			inB := tagging.With(bg, "app", "x")
			inNarrow := tagging.With(bg, "lane", "slow")
			report := tagging.With(inB, "lane", "slow")

			release, err := fe.hold(inNarrow, "select 1 as narrow_holder")
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			w1 := make(chan error, 1)
			go func() { w1 <- fe.exec(report, "select 2 as the_report") }()
			mustEventually(t, "the report waiting", func() bool {
				return fe.budget("narrow").Waiting == 1 && fe.budget("b").Waiting == 1
			})

			// b's bucket past its burst.
			if err := fe.exec(inB, "select pg_sleep(1.3)"); err != nil {
				t.Fatal(err)
			}
			debt := fe.budget("b").Debt
			// Room for the report's and the newcomer's small costs (each under 1/100 s) once the
			// debt is below about 0.98 s.
			roomIn := time.Duration((debt - 0.97) / 0.1 * float64(time.Second))
			start := time.Now()
			w2 := make(chan error, 1)
			go func() { w2 <- fe.exec(inB, "select 3 as behind_the_report") }()

			select {
			case err := <-w2:
				waited := time.Since(start)
				t.Logf("debt %.3fs: room expected in about %v; the statement of b waited %v (%v)", debt, roomIn, waited, err)
				if err != nil {
					t.Errorf("the statement of b: %v", err)
				}
			case <-time.After(roomIn + 8*time.Second):
				st := fe.budget("b")
				t.Errorf("debt %.3fs, room expected in about %v: the statement of b still waits after %v (b: debt %.3fs, %d waiting, %d in flight; its max_wait is 40s)",
					debt, roomIn, time.Since(start), st.Debt, st.Waiting, st.InFlight)
				release()
				<-w2
			}
			release()
			if err := <-w1; err != nil {
				t.Errorf("the report: %v", err)
			}
		})
	}
}
