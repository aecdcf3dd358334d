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

// TestWaitingJobsDoNotFillTheQueue: batch jobs pacing themselves with Wait hold nothing while
// they wait, so they take their turn in the budget's queue but do not count against its bound
// (max_queue), which bounds the statements waiting (and the connections database/sql's hold).
// With the one slot busy and two jobs in Wait, a queue of 2 still takes the application's
// statement, which waits its turn and runs once the slot frees, rather than being refused at
// once as finding the queue full. The budget's Waiting figure counts the jobs too.
func TestWaitingJobsDoNotFillTheQueue(t *testing.T) {
	for _, fe := range openFrontEnds(t, `
budgets:
  - {name: batch, mode: enforce, max_concurrent: 1, max_queue: 2, max_wait: 5s}
rules:
  - {budget: batch, match: {job: import}}
`, 4) {
		t.Run(fe.name, func(t *testing.T) {
			ctx := tagging.With(context.Background(), "job", "import")
			busy := make(chan error, 1)
			go func() { busy <- fe.exec(ctx, "select pg_sleep(0.5)") }()
			waitFor(t, 10*time.Second, "the slot taken", func() (bool, string) {
				b := fe.budget("batch")
				return b.InFlight == 1, fmt.Sprintf("%+v", b)
			})
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			waits := make(chan error, 2)
			for range 2 {
				go func() { waits <- fe.wait(wctx) }()
			}
			waitFor(t, 10*time.Second, "two jobs in Wait", func() (bool, string) {
				b := fe.budget("batch")
				return b.Waiting == 2, fmt.Sprintf("%+v", b)
			})
			err := fe.exec(ctx, "select 2")
			var blocked *driver.BlockedError
			if errors.As(err, &blocked) {
				t.Fatalf("the application's statement, two jobs waiting in a queue of 2: %v; want it to wait its turn", err)
			} else if err != nil {
				t.Fatal(err)
			}
			cancel()
			<-waits
			<-waits
			if err := <-busy; err != nil {
				t.Fatal(err)
			}
		})
	}
}
