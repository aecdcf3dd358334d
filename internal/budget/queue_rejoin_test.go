package budget

import (
	"slices"
	"testing"
)

// A waiter that left its queue at a reload and rejoins (no Forget) keeps its place of arrival,
// also when a later arrival reached max_queue during the gap: the later one is evicted, so that
// the queue stays within its bound.
func TestRejoinQueueFull(t *testing.T) {
	b := New(Spec{MaxConcurrent: 1, MaxQueue: 1})
	why := &Denial{Reason: "concurrency"}
	reqs := func() []Request { return []Request{{Budget: b}} }
	var first, later Waiter
	r1 := reqs()
	if Join(&first, r1, why) >= 0 {
		t.Fatal("join refused")
	}
	Leave(&first, r1) // the reload: decided again
	r2 := reqs()
	if Join(&later, r2, why) >= 0 {
		t.Fatal("later join refused")
	}
	r1 = reqs()
	if Join(&first, r1, why) >= 0 {
		t.Errorf("the earlier arrival was refused (queue full) while a later arrival holds its place: %v", b.queues[""].waiters())
	}
	if n := b.Waiting(""); n != 1 {
		t.Errorf("%d waiting, want 1 (max_queue)", n)
	}
	if l, _ := Evicted(&later, r2); l != 0 {
		t.Errorf("the later arrival: evicted %d, want 0", l)
	}
	if f, _ := Evicted(&first, r1); f != -1 {
		t.Errorf("the first arrival: evicted %d, want -1", f)
	}
	select {
	case <-later.Wake():
	default:
		t.Error("the evicted waiter was not told to try again")
	}
	Leave(&later, r2) // as its statement does once refused
	Leave(&first, r1)
	if n := b.Waiting(""); n != 0 {
		t.Errorf("%d waiting after both left, want 0", n)
	}
}

// TestRejoinIntoAnotherQueueKeepsBound: a reload that sends the waiters of several queues into
// one (a budget's per dropped, a rule moved to another budget) holds them to its bound in arrival
// order, whichever comes back first: the bound holds from the reload on.
func TestRejoinIntoAnotherQueueKeepsBound(t *testing.T) {
	old, merged := New(Spec{MaxConcurrent: 1, MaxQueue: 1}), New(Spec{MaxConcurrent: 1, MaxQueue: 2})
	why := &Denial{Reason: "concurrency"}
	ws := make([]Waiter, 4)
	for i := range ws { // one per tenant, each first in its own queue
		r := []Request{{Budget: old, Key: string(rune('a' + i))}}
		if Join(&ws[i], r, why) >= 0 {
			t.Fatalf("waiter %d refused", i)
		}
		Leave(&ws[i], r) // the reload
	}
	joined := make([][]Request, len(ws))
	for _, i := range []int{3, 1, 0, 2} { // back in another order
		joined[i] = []Request{{Budget: merged}}
		Join(&ws[i], joined[i], why)
	}
	if n := merged.Waiting(""); n != 2 {
		t.Fatalf("%d waiting in the merged queue, want its bound, 2", n)
	}
	for i := range ws {
		queued := slices.Contains(merged.queues[""].waiters(), &ws[i])
		if want := i < 2; queued != want {
			t.Errorf("waiter %d (arrival order) queued %v, want %v", i, queued, want)
		}
	}
}

// Two waiters across two budgets, one rejoining ahead in both: each queue's first is the same.
func TestRejoinTwoBudgetsConsistent(t *testing.T) {
	a, c := New(Spec{MaxConcurrent: 1, MaxQueue: 8}), New(Spec{MaxConcurrent: 1, MaxQueue: 8})
	why := &Denial{Reason: "concurrency"}
	var w1, w2, w3 Waiter
	r1 := []Request{{Budget: a}}
	Join(&w1, r1, why)
	r2 := []Request{{Budget: a}, {Budget: c}}
	Join(&w2, r2, why)
	r3 := []Request{{Budget: c}}
	Join(&w3, r3, why)
	Leave(&w1, r1)
	r1 = []Request{{Budget: c}, {Budget: a}} // rerouted to both
	Join(&w1, r1, why)
	if a.queues[""].waiters()[0] != &w1 || c.queues[""].waiters()[0] != &w1 {
		t.Fatalf("w1 not first in both")
	}
	if a.queues[""].waiters()[1] != &w2 || c.queues[""].waiters()[1] != &w2 || c.queues[""].waiters()[2] != &w3 {
		t.Fatalf("order broken")
	}
}
