package integration

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestInFlightWaiterWokenWhenQueryEnds: a statement throttled by
// `throttle_when: {in_flight: N}` under `max_wait` waits for what waiting can give (internal/engine/admission.go:
// "a healthy sample"). in_flight is the connector's own count, not a
// sample: it drops the moment one of its statements finishes. Yet the waiter is only woken by a
// health sample (none is taken for in_flight), a slot of its own budget, or the denial's
// RetryAfter, which is health_interval: here a statement that could run after ~300 ms waits
// until its max_wait runs out (3 s), ten times longer than needed; with a longer max_wait it
// waits a full health_interval.
func TestInFlightWaiterWokenWhenQueryEnds(t *testing.T) {
	_, db := openRules(t, `
health_interval: 5s
budgets:
  - {name: batch, mode: enforce, max_wait: 3s, throttle_when: {in_flight: 1}}
rules:
  - {budget: batch, match: {job: import}}
`)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "select 1"); err != nil { // warm the pool
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { // an application statement, no budget: in flight for 300 ms
		_, err := db.ExecContext(ctx, "select pg_sleep(0.3)")
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // the application statement is in flight
	start := time.Now()
	_, err := db.ExecContext(tagging.With(ctx, "job", "import"), "select 1")
	took := time.Since(start)
	if err != nil {
		t.Fatalf("batch statement: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if took > 1500*time.Millisecond {
		t.Errorf("the batch statement waited %v; in_flight fell below its threshold after ~200 ms, "+
			"want it admitted then (well under 1.5 s), not at its max_wait (3s) or a health_interval (5s)", took.Round(time.Millisecond))
	}
}
