package coord

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// cost is the predicted and actual execution seconds of every statement of slotWorkers.
const cost = 0.005

// slotWorkers runs workers that each take a slot of b, hold it for hold and give it back,
// trying again after a millisecond when refused, until end. It returns the statements
// admitted and refused after from, and sets most to the most in flight at once (counted in
// across, which workers of other budgets may share) that it saw after from.
func slotWorkers(b *budget.Budget, workers int, hold time.Duration, from, end time.Time, across *atomic.Int64, most *atomic.Int64) (admitted, refused int64) {
	var ok, no atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				r := budget.Request{Budget: b, Cost: cost}
				if _, d := budget.Admit(time.Now(), []budget.Request{r}, nil); d != nil {
					if time.Now().After(from) {
						no.Add(1)
					}
					time.Sleep(time.Millisecond)
					continue
				}
				n := across.Add(1)
				if time.Now().After(from) {
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					ok.Add(1)
				}
				time.Sleep(hold)
				across.Add(-1)
				budget.Release(time.Now(), r, cost)
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

// forge writes, every few milliseconds until the test ends, what script writes into the
// partition's hash in Redis: another writer that does not play by the script's rules.
func forge(t *testing.T, srv *redistest.Server, key, script string) {
	t.Helper()
	rc := newClient(t, srv)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if err := rc.Eval(ctx, script, []string{key}).Err(); err != nil && ctx.Err() == nil && !errors.Is(err, redis.Nil) {
				t.Errorf("forging: %v", err)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
}

// TestForgedRedisStateIsChecked is issue 21's finding 8: whatever else is written into a
// shared budget's hash (an instance entry with negative numbers, one that expires in 2255,
// inf and nan in the partition's state, a field that is not msgpack), the budget never runs
// more than max_concurrent at once nor admits more than its rate and burst, its statements
// still run, and nothing non-finite reaches the status.
func TestForgedRedisStateIsChecked(t *testing.T) {
	const now = "local t = redis.call('TIME'); local now = t[1] * 1000000 + t[2]\n"
	for _, tc := range []struct{ name, script string }{
		{"negative numbers", now + "redis.call('HSET', KEYS[1], 'i:forged', cmsgpack.pack({1, -100, -100, -8, -10, now + 400000, 0}))"},
		{"expiry in 2255", now + "redis.call('HSET', KEYS[1], 'i:forged', cmsgpack.pack({1, 1, 2, 2, 1, 8.9e15, 0}))"},
		{"inf and nan", "redis.call('HSET', KEYS[1], 'tat', 'inf', 'last', 'nan', 'lu', 'inf', 'ln', 'nan', 'i:junk', 'not msgpack')"},
		{"nan tat", "redis.call('HSET', KEYS[1], 'tat', 'nan', 'ln', '1e308', 'lu', '-inf')"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Need(t)
			const interval = 200 * time.Millisecond
			spec := Spec{Name: "forged", Rate: 0.5, Burst: 0.25, MaxConcurrent: 2}
			b, c := sharedBudget(t, srv, spec, interval, "honest")
			forge(t, srv, PartitionKey(spec.Name, ""), tc.script)
			start := time.Now()
			from, end := start.Add(2*interval), start.Add(10*interval)
			var across, most atomic.Int64
			admitted, _ := slotWorkers(b, 8, 5*time.Millisecond, from, end, &across, &most)
			// Everything admitted after from, at cost each: at most the rate over the span
			// plus the burst.
			span := end.Sub(from).Seconds()
			got, limit := float64(admitted)*cost, spec.Rate*span+spec.Burst
			t.Logf("%.3f execution seconds admitted in %.1f s (at most %.3f); at most %d in flight", got, span, limit, most.Load())
			if most.Load() > int64(spec.MaxConcurrent) {
				t.Errorf("%d statements in flight, max_concurrent is %d", most.Load(), spec.MaxConcurrent)
			}
			if got > limit {
				t.Errorf("admitted %.3f execution seconds, the budget allows %.3f", got, limit)
			}
			if admitted == 0 {
				t.Errorf("no statement ran")
			}
			if st := c.Status()[0]; st.Syncs < 3 {
				t.Errorf("%d syncs succeeded in 10 intervals, %d failed", st.Syncs, st.Failures)
			}
			if _, err := json.Marshal(c.Status()); err != nil {
				t.Errorf("status: %v", err)
			}
			if _, err := json.Marshal(b.Snapshot(time.Now())); err != nil {
				t.Errorf("snapshot: %v", err)
			}
		})
	}
}

// TestRollingLimitChangeKeepsEvenShares is issue 21's finding 12: two instances share a
// budget while a change of its max_concurrent is half rolled out (6 on one, 2 on the
// other). Both enforce the smaller limit together, each keeps its even share of it (the
// instance on the lower limit is not shut out), and both show the disagreement.
func TestRollingLimitChangeKeepsEvenShares(t *testing.T) {
	srv := redistest.Need(t)
	const interval = 200 * time.Millisecond
	high, hc := sharedBudget(t, srv, Spec{Name: "rolling", MaxConcurrent: 6}, interval, "high")
	low, lc := sharedBudget(t, srv, Spec{Name: "rolling", MaxConcurrent: 2}, interval, "low")
	start := time.Now()
	from, end := start.Add(3*interval), start.Add(15*interval)
	var across, most, mostHigh, mostLow atomic.Int64
	var wg sync.WaitGroup
	var nHigh, nLow int64
	wg.Add(2)
	go func() {
		defer wg.Done()
		nHigh, _ = slotWorkers(high, 8, 5*time.Millisecond, from, end, &across, &mostHigh)
	}()
	go func() {
		defer wg.Done()
		nLow, _ = slotWorkers(low, 8, 5*time.Millisecond, from, end, &across, &mostLow)
	}()
	wg.Wait()
	most.Store(max(mostHigh.Load(), mostLow.Load()))
	t.Logf("admitted after %v: %d on the instance at 6, %d on the one at 2; at most %d in flight on both",
		from.Sub(start), nHigh, nLow, most.Load())
	if most.Load() > 2 {
		t.Errorf("%d statements in flight on both instances; the smaller limit is 2", most.Load())
	}
	if nLow*2 < nHigh || nHigh*2 < nLow {
		t.Errorf("uneven shares of the smaller limit: %d and %d statements", nHigh, nLow)
	}
	for _, c := range []*Coordinator{hc, lc} {
		st := c.Status()[0]
		if !st.LimitsDiffer || st.LimitsInForce.MaxConcurrent != 2 {
			t.Errorf("instance %s: status %+v, want the disagreement and max_concurrent 2 in force", c.Instance(), st)
		}
	}
}
