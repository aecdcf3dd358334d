package budget

import (
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestReleaseOnce(t *testing.T) {
	for _, key := range []string{"", "k"} {
		t.Run(strconv.Quote(key), func(t *testing.T) {
			b := New(Spec{Rate: 1, Burst: 10, MaxConcurrent: 2})
			reqs := []Request{{Budget: b, Key: key, Cost: 3}}
			if _, d := Admit(at(0), reqs, nil); d != nil {
				t.Fatalf("denied: %+v", *d)
			}
			Release(at(1), &reqs[0], 1) // 1s drained, 2s refunded
			if s := b.Snapshot(at(1)); s.InFlight != 0 || math.Abs(s.Debt) > 1e-12 {
				t.Errorf("after Release: %+v, want nothing in flight, no debt", s)
			}
			Release(at(1), &reqs[0], 5) // released twice: nothing changes
			if s := b.Snapshot(at(1)); s.InFlight != 0 || s.Debt != 0 {
				t.Errorf("after a second Release: %+v", s)
			}
			mustInvariants(t, b)
		})
	}
}

// TestUnkeyedNeverEvicted checks the documented design: the state of key ""
// is kept apart, never evicted and not counted against MaxKeys.
func TestUnkeyedNeverEvicted(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 10, MaxKeys: 2})
	charge(t, at(0), b, "", 5)
	for i := range 10 {
		charge(t, at(0), b, strconv.Itoa(i), 0)
	}
	s := b.Snapshot(at(1))
	if s.Keys != 3 || s.Evicted != 8 || math.Abs(s.Debt-4) > 1e-12 {
		t.Errorf("snapshot %+v, want 3 keys (2 and \"\"), 8 evicted, debt 4", s)
	}
	mustInvariants(t, b)
}

// TestEvictsExactly churns random keys, costs and holds through a small
// table, growing and shrinking it, and checks each eviction against a
// brute-force choice: no state in flight, and none that empties sooner.
func TestEvictsExactly(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 13))
	b := New(Spec{Rate: 1, Burst: 1000, MaxKeys: 6})
	var held []string
	for step := range 5000 {
		now := at(float64(step) * 0.01)
		if rng.IntN(200) == 0 {
			b.SetSpec(now, Spec{Rate: 1, Burst: 1000, MaxKeys: 1 + rng.IntN(12)})
		}
		// What every state was before this admission.
		type was struct {
			emptyAt  time.Time
			inflight int
		}
		before := map[string]was{}
		var soonest time.Time
		for k, s := range b.keys.byKey {
			before[k] = was{s.emptyAt, s.inflight}
			if s.inflight == 0 && (soonest.IsZero() || s.emptyAt.Before(soonest)) {
				soonest = s.emptyAt
			}
		}
		key := strconv.Itoa(rng.IntN(20))
		cost := rng.Float64() * 3
		admit1(t, now, b, key, cost)
		for k, w := range before {
			if _, ok := b.keys.byKey[k]; ok {
				continue
			}
			if w.inflight > 0 {
				t.Fatalf("step %d: evicted %q with %d in flight", step, k, w.inflight)
			}
			if !w.emptyAt.Equal(soonest) {
				t.Fatalf("step %d: evicted %q, empty at %v; another empties at %v", step, k, w.emptyAt, soonest)
			}
		}
		if rng.IntN(3) == 0 {
			held = append(held, key)
		} else {
			Release(now, &Request{Budget: b, Key: key, Cost: cost}, cost*rng.Float64()*2)
		}
		if len(held) > 4 || len(held) > 0 && rng.IntN(3) == 0 {
			Release(now, &Request{Budget: b, Key: held[0]}, 0)
			held = held[1:]
		}
		mustInvariants(t, b)
	}
	if s := b.Snapshot(at(100)); s.Evicted < 1000 {
		t.Errorf("only %d evictions: the test did not churn", s.Evicted)
	}
}

// TestConcurrentRelease admits from several goroutines over shared budgets,
// one and several requests at a time, and releases while the small tables
// churn; everything must be given back.
func TestConcurrentRelease(t *testing.T) {
	budgets := []*Budget{
		New(Spec{Rate: 100, Burst: 10, MaxConcurrent: 3, MaxKeys: 3}),
		New(Spec{MaxConcurrent: 2}),
	}
	var clock atomic.Int64
	var admitted [2]atomic.Int64 // admissions per budget
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			reqs := make([]Request, 0, 2)
			for range 2000 {
				reqs = reqs[:0]
				reqs = append(reqs, Request{Budget: budgets[0], Key: strconv.Itoa(rng.IntN(6)), Cost: 0.01})
				if rng.IntN(2) == 0 {
					reqs = append(reqs, Request{Budget: budgets[1], Cost: 0.01})
				}
				now := t0.Add(time.Duration(clock.Add(100_000)))
				if _, d := Admit(now, reqs, nil); d != nil {
					continue
				}
				for _, r := range reqs {
					admitted[idx(budgets, r.Budget)].Add(1)
					Release(t0.Add(time.Duration(clock.Add(100_000))), &r, rng.Float64()*0.02)
				}
			}
		})
	}
	wg.Wait()
	for i, b := range budgets {
		mustInvariants(t, b)
		if s := b.Snapshot(t0.Add(time.Duration(clock.Load()))); s.InFlight != 0 || admitted[i].Load() == 0 {
			t.Errorf("budget %d after %d admissions: %+v", i, admitted[i].Load(), s)
		}
	}
}
