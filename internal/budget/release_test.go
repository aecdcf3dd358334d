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

func TestReleaseHandle(t *testing.T) {
	for _, key := range []string{"", "k"} {
		t.Run(strconv.Quote(key), func(t *testing.T) {
			b := New(Spec{Rate: 1, Burst: 10, MaxConcurrent: 2})
			reqs := []Request{{Budget: b, Key: key, Cost: 3}}
			if _, d := Admit(at(0), reqs, nil); d != nil {
				t.Fatalf("denied: %+v", *d)
			}
			if reqs[0].st == nil || reqs[0].st != b.tab.lookup(key) {
				t.Fatalf("Admit left handle %p, want the key's state %p", reqs[0].st, b.tab.lookup(key))
			}
			Release(at(1), &reqs[0], 1) // 1s drained, 2s refunded
			if s := b.Snapshot(at(1)); s.InFlight != 0 || math.Abs(s.Debt) > 1e-12 {
				t.Errorf("after Release: %+v, want nothing in flight, no debt", s)
			}
			Release(at(1), &reqs[0], 5) // released twice: nothing changes
			if s := b.Snapshot(at(1)); s.InFlight != 0 || s.Debt != 0 {
				t.Errorf("after a second Release: %+v", s)
			}
			Release(at(1), &Request{Budget: b, Key: key, Cost: 1}, 5) // never admitted
			if s := b.Snapshot(at(1)); s.InFlight != 0 || s.Debt != 0 {
				t.Errorf("after releasing a request never admitted: %+v", s)
			}
			mustInvariants(t, b)
		})
	}
}

// TestHandleSurvivesChurn holds one request while many keys are churned
// through a small table, with reloads on the way, and releases it by its
// handle. Were an in-flight state ever evicted (and reused for another key),
// the handle would no longer be the key's state and the slot would leak.
func TestHandleSurvivesChurn(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 100, MaxConcurrent: 1, MaxKeys: 4})
	held := []Request{{Budget: b, Key: "held", Cost: 2}}
	if _, d := Admit(at(0), held, nil); d != nil {
		t.Fatalf("denied: %+v", *d)
	}
	st := held[0].st
	reqs := []Request{{Budget: b, Cost: 0.01}}
	for i := range 1000 {
		now := at(float64(i) * 1e-3)
		reqs[0].Key = "churn-" + strconv.Itoa(i)
		if _, d := Admit(now, reqs, nil); d != nil {
			t.Fatalf("key %d denied: %+v", i, *d)
		}
		Release(now, &reqs[0], 0.02)
		switch i {
		case 300: // a reload that changes the rate and shrinks the table
			b.SetSpec(now, Spec{Rate: 2, Burst: 100, MaxConcurrent: 1, MaxKeys: 1})
		case 600: // and one that grows it again
			b.SetSpec(now, Spec{Rate: 1, Burst: 100, MaxConcurrent: 1, MaxKeys: 8})
		}
		if b.tab.keys["held"] != st || !b.tab.owns(st, "held") {
			t.Fatalf("after key %d the held request's state was evicted or replaced", i)
		}
		mustInvariants(t, b)
	}
	if s := b.Snapshot(at(1)); s.InFlight != 1 || s.Evicted == 0 {
		t.Fatalf("before the release: %+v, want 1 in flight and evictions", s)
	}
	Release(at(1), &held[0], 2)
	if s := b.Snapshot(at(1)); s.InFlight != 0 {
		t.Errorf("after releasing the held request: %d in flight", s.InFlight)
	}
	if st.inflight != 0 {
		t.Errorf("held state still has %d in flight", st.inflight)
	}
	mustInvariants(t, b)
}

// TestStaleHandle releases handles whose state has since been reused for
// another key, or whose request was moved to another budget: they must act
// as a release by key, never on the state they point to.
func TestStaleHandle(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 10, MaxKeys: 1})
	ra := []Request{{Budget: b, Key: "a", Cost: 1}}
	admit := func(reqs []Request) {
		t.Helper()
		if _, d := Admit(at(0), reqs, nil); d != nil {
			t.Fatalf("denied: %+v", *d)
		}
	}
	admit(ra)
	copyA := ra[0]
	Release(at(0), &ra[0], 1)
	rb := []Request{{Budget: b, Key: "b", Cost: 1}}
	admit(rb) // evicts a, reusing its state for b
	if rb[0].st != copyA.st {
		t.Fatal("the table did not reuse a's state for b; the test needs it to")
	}
	Release(at(0), &copyA, 1) // a second release of a
	if s := b.Snapshot(at(0)); s.InFlight != 1 || rb[0].st.inflight != 1 {
		t.Fatalf("a stale handle of a released b: %+v", s)
	}

	// A request moved to another budget after Admit releases there, by key.
	other := New(Spec{Rate: 1, Burst: 10})
	ro := []Request{{Budget: other, Key: "b", Cost: 1}}
	admit(ro)
	moved := rb[0]
	moved.Budget = other
	Release(at(0), &moved, 1)
	if s := other.Snapshot(at(0)); s.InFlight != 0 {
		t.Errorf("other budget after the moved release: %+v", s)
	}
	if s := b.Snapshot(at(0)); s.InFlight != 1 {
		t.Errorf("first budget after a release moved away: %+v", s)
	}
	// The same for the unkeyed state.
	u1, u2 := New(Spec{}), New(Spec{})
	ru := []Request{{Budget: u1}}
	admit(ru)
	admit([]Request{{Budget: u2}})
	ru[0].Budget = u2
	Release(at(0), &ru[0], 0)
	if s1, s2 := u1.Snapshot(at(0)), u2.Snapshot(at(0)); s1.InFlight != 1 || s2.InFlight != 0 {
		t.Errorf("unkeyed handle moved to another budget: in flight %d and %d, want 1 and 0", s1.InFlight, s2.InFlight)
	}
	for _, b := range []*Budget{b, other, u1, u2} {
		mustInvariants(t, b)
	}
}

// TestHandleMatchesKeyRelease runs the same random program on three budgets,
// releasing by key on one, by handle on another (including releases repeated
// after the state was evicted and reused) and by handle with ReleaseAfter the
// time since admission on the third, and compares them.
func TestHandleMatchesKeyRelease(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	type admission struct {
		reqs [3]Request // by key, by handle, after
		at   float64    // when admitted
	}
	for round := range 20 {
		spec := Spec{Rate: 1, Burst: 3, MaxConcurrent: 2, MaxKeys: 1 + rng.IntN(6), WarningThreshold: 0.5}
		byKey, byHandle, byAfter := New(spec), New(spec), New(spec)
		var admitted []admission // released entries stay, for repeats
		now := 0.0
		for step := range 400 {
			now += rng.Float64() * 0.2
			switch op := rng.IntN(10); {
			case op < 5:
				key := ""
				if k := rng.IntN(9); k > 0 {
					key = strconv.Itoa(k)
				}
				cost := rng.Float64()
				warnOnly := rng.IntN(4) == 0
				r1 := []Request{{Budget: byKey, Key: key, Cost: cost, WarnOnly: warnOnly}}
				r2 := []Request{{Budget: byHandle, Key: key, Cost: cost, WarnOnly: warnOnly}}
				r3 := []Request{{Budget: byAfter, Key: key, Cost: cost, WarnOnly: warnOnly}}
				w1, d1 := Admit(at(now), r1, nil)
				w2, d2 := Admit(at(now), r2, nil)
				w3, d3 := Admit(at(now), r3, nil)
				if (d1 == nil) != (d2 == nil) || d1 != nil && *d1 != *d2 || len(w1) != len(w2) ||
					(d1 == nil) != (d3 == nil) || d1 != nil && *d1 != *d3 || len(w1) != len(w3) {
					t.Fatalf("round %d step %d: admissions differ: %v %v / %v %v / %v %v", round, step, d1, w1, d2, w2, d3, w3)
				}
				if d1 == nil {
					admitted = append(admitted, admission{[3]Request{r1[0], r2[0], r3[0]}, now})
				}
			case op < 9 && len(admitted) > 0:
				i := rng.IntN(len(admitted))
				actual := rng.Float64() * 2
				a := &admitted[i]
				byKey.Release(at(now), a.reqs[0].Key, a.reqs[0].Cost, actual)
				Release(at(now), &a.reqs[1], actual)
				ReleaseAfter(&a.reqs[2], at(now).Sub(at(a.at)), actual)
				if rng.IntN(4) > 0 { // else it may be released again later
					admitted = append(admitted[:i], admitted[i+1:]...)
				}
			default:
				spec.MaxKeys = 1 + rng.IntN(6)
				spec.Rate = float64(rng.IntN(3))
				byKey.SetSpec(at(now), spec)
				byHandle.SetSpec(at(now), spec)
				byAfter.SetSpec(at(now), spec)
			}
			s1, s2, s3 := byKey.Snapshot(at(now)), byHandle.Snapshot(at(now)), byAfter.Snapshot(at(now))
			if s1 != s2 || s1 != s3 {
				t.Fatalf("round %d step %d: by key %+v, by handle %+v, after %+v", round, step, s1, s2, s3)
			}
			mustInvariants(t, byKey)
			mustInvariants(t, byHandle)
			mustInvariants(t, byAfter)
		}
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

// TestLazyHeapEvictsExactly churns random keys, costs and holds through a
// small table, growing and shrinking it, and checks each eviction against a
// brute-force choice: no state in flight, and none that empties sooner.
func TestLazyHeapEvictsExactly(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 13))
	b := New(Spec{Rate: 1, Burst: 1000, MaxKeys: 6})
	var held []string
	staleSteps := 0
	for step := range 5000 {
		now := at(float64(step) * 0.01)
		if rng.IntN(200) == 0 {
			b.SetSpec(now, Spec{Rate: 1, Burst: 1000, MaxKeys: 1 + rng.IntN(12)})
		}
		if b.tab.stale {
			staleSteps++
		}
		// What every state was before this admission.
		type was struct {
			emptyAt  int64
			inflight int32
		}
		before := map[string]was{}
		soonest := int64(math.MaxInt64)
		for k, s := range b.tab.keys {
			before[k] = was{b.tab.emptyAt(s), s.inflight}
			if s.inflight == 0 {
				soonest = min(soonest, b.tab.emptyAt(s))
			}
		}
		key := strconv.Itoa(rng.IntN(20))
		cost := rng.Float64() * 3
		admit1(t, now, b, key, cost)
		for k, w := range before {
			if _, ok := b.tab.keys[k]; ok {
				continue
			}
			if w.inflight > 0 {
				t.Fatalf("step %d: evicted %q with %d in flight", step, k, w.inflight)
			}
			if w.emptyAt != soonest {
				t.Fatalf("step %d: evicted %q, empty at %d; another empties at %d", step, k, w.emptyAt, soonest)
			}
		}
		if rng.IntN(3) == 0 {
			held = append(held, key)
		} else {
			b.Release(now, key, cost, cost*rng.Float64()*2)
		}
		if len(held) > 4 || len(held) > 0 && rng.IntN(3) == 0 {
			b.Release(now, held[0], 0, 0)
			held = held[1:]
		}
		mustInvariants(t, b)
	}
	if s := b.Snapshot(at(100)); s.Evicted < 1000 {
		t.Errorf("only %d evictions: the test did not churn", s.Evicted)
	}
	if staleSteps == 0 {
		t.Error("the heap was never stale: the test did not grow the table")
	}
}

// TestConcurrentHandleRelease admits from several goroutines over shared
// budgets, one and several requests at a time, and releases by handle while
// the small tables churn; everything must be given back.
func TestConcurrentHandleRelease(t *testing.T) {
	budgets := []*Budget{
		New(Spec{Rate: 100, Burst: 10, MaxConcurrent: 3, MaxKeys: 3}),
		New(Spec{MaxConcurrent: 2}),
	}
	var clock atomic.Int64
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
					Release(t0.Add(time.Duration(clock.Add(100_000))), &r, rng.Float64()*0.02)
				}
			}
		})
	}
	wg.Wait()
	for i, b := range budgets {
		mustInvariants(t, b)
		if s := b.Snapshot(t0.Add(time.Duration(clock.Load()))); s.InFlight != 0 || s.Admitted == 0 {
			t.Errorf("budget %d after the run: %+v", i, s)
		}
	}
}
