package budget

import (
	"testing"
	"time"
)

// TestTakeWaiterBucket: a warn budget's request that the bucket refuses runs as a would-be
// waiter (TakeWaiter) when the bucket drains enough within maxWait and the key's would-be
// waiters leave room in its queue; it takes its cost, so the next one waits longer; once
// released it leaves the queue. A wait past maxWait, a full queue, or no maxWait: refused.
func TestTakeWaiterBucket(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 1, MaxQueue: 2})
	charge(t, t0, b, "k", 1) // full: a cost of 0.5 fits in 0.5 s
	try := func(cost float64, maxWait time.Duration) (*Request, bool) {
		r := &Request{Budget: b, Key: "k", Cost: cost}
		_, d := Admit(t0, []Request{*r}, nil)
		if d == nil {
			t.Fatalf("admitted a cost of %v into a full bucket", cost)
		}
		return r, TakeWaiter(t0, r, d, maxWait)
	}
	if _, ok := try(0.5, 0); ok {
		t.Errorf("a would-be waiter without max_wait")
	}
	if _, ok := try(0.5, 400*time.Millisecond); ok {
		t.Errorf("a would-be waiter whose wait (500 ms) outlasts max_wait (400 ms)")
	}
	first, ok := try(0.5, time.Second)
	if !ok {
		t.Fatalf("a wait of 500 ms under max_wait 1s: refused")
	}
	if _, ok := try(0.5, 800*time.Millisecond); ok {
		t.Errorf("a wait of 1 s (the first would-be waiter's cost taken first) under max_wait 800ms: taken")
	}
	second, ok := try(0.1, 2*time.Second)
	if !ok {
		t.Fatalf("the second would-be waiter, queue of 2: refused")
	}
	if _, ok := try(0.1, time.Hour); ok {
		t.Errorf("a third would-be waiter, queue of 2: taken")
	}
	Release(t0, first, 0.5)
	if third, ok := try(0.1, time.Hour); !ok {
		t.Errorf("a would-be waiter after one was released: refused")
	} else {
		Release(t0, third, 0.1)
	}
	Release(t0, second, 0.1)
	if n := len(b.wouldWait); n != 0 {
		t.Errorf("would-be waiters counted after all were released: %v", b.wouldWait)
	}
	if err := invariants(b); err != nil {
		t.Error(err)
	}
}

// TestTakeWaiterQueueFollowsSlots: warn mode counts a would-be waiter against max_queue only
// while enforce would have it waiting: once a slot frees (any statement ends), enforce would
// have admitted the oldest waiter, so two workers taking turns over a max_concurrent of 1 with a
// max_queue of 1 are never counted past the bound, and run unwarned, as enforce queues them.
func TestTakeWaiterQueueFollowsSlots(t *testing.T) {
	b := New(Spec{MaxConcurrent: 1, MaxQueue: 1})
	first := admit1(t, at(0), b, "", 0)
	try := func(now time.Time) (*Request, bool) {
		reqs := []Request{{Budget: b}}
		_, d := Admit(now, reqs, nil)
		if d == nil {
			return &reqs[0], true
		}
		return &reqs[0], TakeWaiter(now, &reqs[0], d, 3*time.Second)
	}
	second, ok := try(at(0))
	if !ok {
		t.Fatal("a would-be waiter behind one slot with max_queue 1 was refused")
	}
	Release(at(1), first, 1) // the slot enforce would give the second: it waits no more
	third, ok := try(at(1))
	if !ok {
		t.Fatal("a would-be waiter refused with the queue empty in enforce's terms (the second would hold the slot)")
	}
	if _, ok := try(at(1)); ok {
		t.Fatal("a would-be waiter taken past max_queue: the third waits, a fourth finds the queue full")
	}
	Release(at(2), second, 1)
	Release(at(2), third, 1)
}

// TestRecentCostFollowsTheLargeStatements: what Check asks a bucket for. It rises at once to a
// larger statement's cost (its reservation or its charge, the larger), and moves back slowly
// towards smaller ones; statements that never ran teach it nothing.
func TestRecentCostFollowsTheLargeStatements(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 10})
	if c := b.RecentCost(); c != 0 {
		t.Fatalf("RecentCost before any ran = %v, want 0", c)
	}
	r := admit1(t, at(0), b, "", 0.1)
	Release(at(1), r, 0.5) // charged more than it reserved
	if c := b.RecentCost(); c != 0.5 {
		t.Fatalf("RecentCost = %v after a statement charged 0.5, want 0.5", c)
	}
	r = admit1(t, at(1), b, "", 0.1)
	Release(at(2), r, 0.1)
	if c := b.RecentCost(); !(c < 0.5 && c > 0.1) {
		t.Fatalf("RecentCost = %v after a smaller one, want between 0.1 and 0.5 (moving back slowly)", c)
	}
	before := b.RecentCost()
	r = admit1(t, at(2), b, "", 2)
	Return(at(2), r) // never ran
	if c := b.RecentCost(); c != before {
		t.Fatalf("RecentCost = %v after a statement that never ran, want %v", c, before)
	}
	r = admit1(t, at(2), b, "", 0.1)
	Release(at(3), r, 20) // ran far past the burst
	if c := b.RecentCost(); c != 10 {
		t.Fatalf("RecentCost = %v after a statement charged 20, want the burst, 10 (what can fit)", c)
	}
}

// TestTakeWaiterSlotTurns: warn mode's wait for a slot is one mean hold time for every
// max_concurrent statements in flight beyond the limit, the new one included: the slots in use
// free together (a burst), so under max_concurrent 2 with statements that hold their slot 1.3 s,
// the first two beyond the limit wait one hold (1.3 s, over a max_wait of 1 s: enforce refuses
// them, warn must not run them unwarned), and under a max_wait of 2 s they wait, and the next
// two wait a second hold (2.6 s): refused.
func TestTakeWaiterSlotTurns(t *testing.T) {
	b := New(Spec{MaxConcurrent: 2, MaxQueue: 8})
	Release(at(1.3), admit1(t, at(0), b, "", 0), 0) // the budget learns a hold of 1.3 s
	running := []*Request{admit1(t, at(2), b, "", 0), admit1(t, at(2), b, "", 0)}
	try := func(maxWait time.Duration) (*Request, bool) {
		reqs := []Request{{Budget: b}}
		_, d := Admit(at(2), reqs, nil)
		if d == nil {
			t.Fatal("admitted beyond max_concurrent")
		}
		return &reqs[0], TakeWaiter(at(2), &reqs[0], d, maxWait)
	}
	if _, ok := try(time.Second); ok {
		t.Error("a would-be waiter for one hold (1.3 s) under max_wait 1s: taken")
	}
	var waiting []*Request
	for i := range 2 {
		r, ok := try(2 * time.Second)
		if !ok {
			t.Fatalf("would-be waiter %d of the first turn (one hold, 1.3 s) under max_wait 2s: refused", i+1)
		}
		waiting = append(waiting, r)
	}
	if _, ok := try(2 * time.Second); ok {
		t.Error("a would-be waiter of the second turn (two holds, 2.6 s) under max_wait 2s: taken")
	}
	for _, r := range append(running, waiting...) {
		Release(at(3), r, 0)
	}
	if err := invariants(b); err != nil {
		t.Error(err)
	}
}

// TestTakeWaiterBucketWaitEnds: a would-be waiter for bucket room leaves enforce's queue when its
// wait ends, not when its statement does: enforce would have admitted it then. Under max_queue 1,
// one waiting 0.5 s for room fills the queue until then; past it (still running), the next
// statement refused for room finds the queue empty.
func TestTakeWaiterBucketWaitEnds(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 1, MaxQueue: 1})
	charge(t, t0, b, "k", 1) // full: a cost of 0.5 fits in 0.5 s
	try := func(now time.Time) (*Request, bool) {
		r := &Request{Budget: b, Key: "k", Cost: 0.5}
		_, d := Admit(now, []Request{*r}, nil)
		if d == nil {
			t.Fatalf("admitted at %v", now.Sub(t0))
		}
		return r, TakeWaiter(now, r, d, 3*time.Second)
	}
	first, ok := try(t0)
	if !ok {
		t.Fatal("the first would-be waiter, queue empty: refused")
	}
	if _, ok := try(at(0.2)); ok {
		t.Error("a second would-be waiter while the first still waits (until 0.5 s), max_queue 1: taken")
	}
	second, ok := try(at(0.6))
	if !ok {
		t.Fatal("a would-be waiter after the first one's wait ended (0.5 s), max_queue 1: refused")
	}
	Release(at(1), first, 0.5)
	Release(at(1), second, 0.5)
	if n := len(b.wouldWait); n != 0 {
		t.Errorf("would-be waiters counted after all were released: %v", b.wouldWait)
	}
	if err := invariants(b); err != nil {
		t.Error(err)
	}
}
