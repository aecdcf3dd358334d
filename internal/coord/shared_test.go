package coord

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// These tests steer the real local budget (internal/budget) through coordinators on a real
// redis-server, as the engine wires them.

// sharedBudget registers a budget of spec's limits with a new coordinator named id, makes
// it shared and starts the coordinator; it is closed at cleanup.
func sharedBudget(t *testing.T, srv *redistest.Server, spec Spec, interval time.Duration, id string) (*budget.Budget, *Coordinator) {
	t.Helper()
	c := newCoord(t, Options{Client: newClient(t, srv), Interval: interval, Instance: id, Logger: quiet})
	b := budget.New(budget.Spec{Rate: spec.Rate, Burst: spec.Burst, MaxConcurrent: spec.MaxConcurrent})
	h := c.Register(spec, b)
	b.SetShared(time.Now(), h.Kick, interval/10)
	c.Start()
	t.Cleanup(func() { c.Close(context.Background()) })
	return b, c
}

// slotWorkers runs workers that each take a slot of b, hold it for hold and give it back,
// trying again after a millisecond when refused, until end. It returns the statements
// admitted and refused after from, and the most in flight at once that it saw (in across).
func slotWorkers(b *budget.Budget, workers int, hold time.Duration, from, end time.Time, across *atomic.Int64, most *atomic.Int64) (admitted, refused int64) {
	var ok, no atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				r := budget.Request{Budget: b, Cost: 0.001}
				if _, d := budget.Admit(time.Now(), []budget.Request{r}, nil); d != nil {
					if time.Now().After(from) {
						no.Add(1)
					}
					time.Sleep(time.Millisecond)
					continue
				}
				n := across.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				if time.Now().After(from) {
					ok.Add(1)
				}
				time.Sleep(hold)
				across.Add(-1)
				budget.Release(time.Now(), r, 0.001)
			}
		}()
	}
	wg.Wait()
	return ok.Load(), no.Load()
}

// TestSharedSlotsServeABurstAtOnce is issue 21's finding 3: one instance alone under a
// shared max_concurrent of 64, with 8 workers. The lease must cover all 8 within one sync
// interval (the refusals count as 8 slots wanted, and the starved instance syncs early),
// not grow by one slot per sync.
func TestSharedSlotsServeABurstAtOnce(t *testing.T) {
	srv := redistest.Need(t)
	const interval = 500 * time.Millisecond
	b, _ := sharedBudget(t, srv, Spec{Name: "burst", MaxConcurrent: 64}, interval, "alone")
	start := time.Now()
	var across, most atomic.Int64
	admitted, refused := slotWorkers(b, 8, 5*time.Millisecond, start.Add(interval), start.Add(3*interval), &across, &most)
	t.Logf("after the first interval: %d admitted, %d refused; at most %d in flight", admitted, refused, most.Load())
	if admitted == 0 || refused*100 > admitted {
		t.Fatalf("after the first interval %d statements were refused and %d admitted, under max_concurrent 64 with 8 workers",
			refused, admitted)
	}
}
