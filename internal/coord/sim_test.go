package coord

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// simBudget is a minimal local budget as the budget package is to implement [Local]: one
// partition, a reverse leaky bucket that enforces exactly its lease (draining at the lease's
// rate, holding at most its burst), the counters TakeUsage reports, and a kick when it
// refuses. Statements are instantaneous: their cost is charged at admission.
type simBudget struct {
	mu       sync.Mutex // protects the fields below
	lease    budget.Lease
	has      bool
	debt     float64
	at       time.Time
	offered  float64
	used     float64
	starved  bool
	admitted map[int64]float64 // admitted cost per 100 ms bucket
	kick     func()
	history  []string // lease changes, for a failure's log
}

// drain drains the debt up to now; a time before the last one seen drains nothing.
func (b *simBudget) drain(now time.Time) {
	if b.at.IsZero() || now.After(b.at) {
		if !b.at.IsZero() {
			b.debt = max(0, b.debt-b.lease.Rate*now.Sub(b.at).Seconds())
		}
		b.at = now
	}
}

func (b *simBudget) admit(now time.Time, cost float64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.drain(now)
	b.offered += cost
	// A partition with no debt admits one statement larger than its lease's burst.
	if !b.has || b.lease.Rate == 0 || b.debt+cost > b.lease.Burst && b.debt > 0 {
		b.starved = true
		if b.kick != nil {
			go b.kick()
		}
		return false
	}
	b.debt += cost
	b.used += cost
	b.admitted[now.UnixNano()/int64(100*time.Millisecond)] += cost
	return true
}

func (b *simBudget) TakeUsage(time.Time) []budget.Usage {
	b.mu.Lock()
	defer b.mu.Unlock()
	u := budget.Usage{Offered: b.offered, Used: b.used, Starved: b.starved}
	b.offered, b.used, b.starved = 0, 0, false
	if !active(&u) {
		return nil
	}
	return []budget.Usage{u}
}

func (b *simBudget) SetLease(now time.Time, _ string, l budget.Lease) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.drain(now) // the debt so far drains at the old rate
	// A debt run up under a larger lease is capped at the new burst: kept whole, it would
	// shut the partition out for debt / rate, long after the global bucket drained it.
	b.debt = min(b.debt, l.Burst)
	b.lease, b.has = l, true
	b.history = append(b.history, fmt.Sprintf("%s %.3g/%.3g", now.Format("05.000"), l.Rate, l.Burst))
}

// TestSimulatedInstancesHoldTheRate runs eight instances against one Redis, each offering
// statements through a simBudget, and checks what they admit together: about the budget's
// rate, no 1-second window above rate + burst, and a fair split.
func TestSimulatedInstancesHoldTheRate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for seconds")
	}
	const (
		// Long enough that a loaded test machine does not make a lease lapse (see the
		// package doc on instances cut off from Redis).
		interval = 500 * time.Millisecond
		cost     = 0.01 // execution seconds per statement
	)
	often := func(int) time.Duration { return time.Millisecond } // 10 s/s offered, 40× a share
	for _, tc := range []struct {
		name  string
		every func(i int) time.Duration // how often instance i offers a statement
		pause bool                      // stop Redis (SIGSTOP) for a second mid-run
		check func(t *testing.T, per []float64, span float64)
	}{
		{name: "equal demand", every: often},
		{name: "10:1 demand", every: func(i int) time.Duration {
			if i < 4 {
				return time.Millisecond
			}
			return 10 * time.Millisecond // 1 s/s: ten times less, still 4× a share
		}},
		{name: "small demand below its share", every: func(i int) time.Duration {
			if i == 0 {
				return 100 * time.Millisecond // 0.1 s/s, below its share of 0.25
			}
			return time.Millisecond
		}, check: func(t *testing.T, per []float64, span float64) {
			if got := per[0] / span; got < 0.09 {
				t.Errorf("the small instance admitted %.3f/s of the 0.1/s it offered", got)
			}
		}},
		{name: "Redis paused", every: often, pause: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Need(t)
			rc := newClient(t, srv)
			spec := Spec{Name: "sim", Rate: 2, Burst: 1}
			budgets := make([]*simBudget, 8)
			for i := range budgets {
				b := &simBudget{admitted: map[int64]float64{}}
				c := newCoord(t, Options{Client: rc, Interval: interval, Instance: fmt.Sprintf("sim%d", i), Logger: quiet})
				h := c.Register(spec, b)
				b.kick = h.Kick
				c.Start()
				t.Cleanup(func() { c.Close(context.Background()) })
				budgets[i] = b
			}

			start := time.Now()
			from, end := start.Add(2*time.Second), start.Add(5*time.Second)
			// Statements are offered at fixed times, however often the machine lets the
			// goroutine run: what is offered does not depend on the test machine's load.
			var wg sync.WaitGroup
			for i, b := range budgets {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next := start; next.Before(end); time.Sleep(5 * time.Millisecond) {
						for now := time.Now(); !next.After(now) && next.Before(end); next = next.Add(tc.every(i)) {
							b.admit(next, cost)
						}
					}
				}()
			}
			if tc.pause {
				time.Sleep(time.Until(start.Add(3 * time.Second)))
				if err := srv.Pause(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(time.Second)
				if err := srv.Resume(); err != nil {
					t.Fatal(err)
				}
			}
			wg.Wait()

			b0, b1 := from.UnixNano()/int64(100*time.Millisecond), end.UnixNano()/int64(100*time.Millisecond)
			total := make([]float64, b1-b0)
			per := make([]float64, len(budgets))
			for i, b := range budgets {
				b.mu.Lock()
				for k, v := range b.admitted {
					if k >= b0 && k < b1 {
						total[k-b0] += v
						per[i] += v
					}
				}
				b.mu.Unlock()
			}
			span := end.Sub(from).Seconds()
			sum, worst := 0.0, 0.0
			for i, v := range total {
				sum += v
				if i+10 <= len(total) {
					w := 0.0
					for _, x := range total[i : i+10] {
						w += x
					}
					worst = max(worst, w)
				}
			}
			aggregate := sum / span
			t.Logf("aggregate %.3f execution-s/s for a rate of %v; largest 1 s window %.3f; Jain %.3f; per instance %.3v",
				aggregate, spec.Rate, worst, jain(per), per)
			if aggregate < 0.95*spec.Rate || aggregate > 1.05*spec.Rate {
				t.Errorf("aggregate %.3f, want within 5%% of %v", aggregate, spec.Rate)
			}
			if worst > spec.Rate+spec.Burst+cost {
				t.Errorf("a 1 s window admitted %.3f > rate + burst = %v", worst, spec.Rate+spec.Burst)
			}
			if tc.check != nil {
				tc.check(t, per, span)
			} else if j := jain(per); j < 0.95 {
				t.Errorf("Jain's index %.3f < 0.95", j)
			}
			if t.Failed() {
				for i, b := range budgets {
					b.mu.Lock()
					t.Logf("instance %d leases: %v", i, b.history)
					b.mu.Unlock()
				}
			}
		})
	}
}

// simSlots is a minimal local budget for max_concurrent: at most its lease's slots of its
// statements run at once; it reports the peak wanted and those in flight.
type simSlots struct {
	mu       sync.Mutex // protects the fields below
	slots    int
	inflight int
	peak     int
	starved  bool
	kick     func()
}

func (s *simSlots) acquire() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inflight >= s.slots {
		s.peak = max(s.peak, s.inflight+1)
		s.starved = true
		if s.kick != nil {
			go s.kick()
		}
		return false
	}
	s.inflight++
	s.peak = max(s.peak, s.inflight)
	return true
}

func (s *simSlots) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight--
}

func (s *simSlots) TakeUsage(time.Time) []budget.Usage {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := budget.Usage{Wanted: s.peak, InFlight: s.inflight, Starved: s.starved}
	s.peak, s.starved = s.inflight, false
	if !active(&u) {
		return nil
	}
	return []budget.Usage{u}
}

func (s *simSlots) SetLease(_ time.Time, _ string, l budget.Lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slots = l.Slots
}

// TestSimulatedInstancesHoldMaxConcurrent runs eight instances whose workers hold slots for
// 20 ms at a time, four workers on half of them and one on the others, and counts the
// statements running across all of them: never more than max_concurrent. (max_concurrent
// equals the instances here, so that even a lease lapsing on a loaded machine, which leaves
// each instance one slot, cannot exceed it.)
func TestSimulatedInstancesHoldMaxConcurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for seconds")
	}
	rc := newClient(t, redistest.Need(t))
	const interval = 500 * time.Millisecond // see TestSimulatedInstancesHoldTheRate
	spec := Spec{Name: "slots", MaxConcurrent: 8}
	var running, most, samples, sum atomic.Int64
	locals := make([]*simSlots, 8)
	for i := range locals {
		s := &simSlots{}
		c := newCoord(t, Options{Client: rc, Interval: interval, Instance: fmt.Sprintf("slots%d", i), Logger: quiet})
		s.kick = c.Register(spec, s).Kick
		c.Start()
		t.Cleanup(func() { c.Close(context.Background()) })
		locals[i] = s
	}
	end := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for i, s := range locals {
		workers := 1
		if i%2 == 0 {
			workers = 4
		}
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(end) {
					if !s.acquire() {
						time.Sleep(2 * time.Millisecond)
						continue
					}
					n := running.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					samples.Add(1)
					sum.Add(n)
					time.Sleep(20 * time.Millisecond)
					running.Add(-1)
					s.release()
				}
			}()
		}
	}
	wg.Wait()
	t.Logf("at most %d running of %d; %.2f on average at a statement's start", most.Load(), spec.MaxConcurrent,
		float64(sum.Load())/float64(max(samples.Load(), 1)))
	if most.Load() > int64(spec.MaxConcurrent) {
		t.Fatalf("%d statements ran at once, max_concurrent is %d", most.Load(), spec.MaxConcurrent)
	}
	if samples.Load() == 0 {
		t.Fatal("no statement ran")
	}
}
