package budget

import (
	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"math/rand/v2"
	"testing"
)

// woken reports whether w's wake channel has a signal, taking it.
func woken(w *Waiter) bool {
	select {
	case <-w.Wake():
		return true
	default:
		return false
	}
}

func TestQueueAdmitsInArrivalOrder(t *testing.T) {
	b := New(Spec{MaxConcurrent: 1, MaxQueue: 8})
	admit1(t, at(0), b, "", 0)
	ws := make([]Waiter, 6)
	reqs := make([][]Request, len(ws))
	for i := range ws {
		reqs[i] = []Request{{Budget: b}}
		_, d := Admit(at(0), reqs[i], nil)
		if d == nil || d.Reason != vocab.ReasonConcurrency {
			t.Fatalf("waiter %d: denial %+v, want concurrency", i, d)
		}
		if i > 0 && !d.Queued {
			t.Fatalf("waiter %d arrived behind %d others and was not told so: %+v", i, i, d)
		}
		if Join(&ws[i], reqs[i], d) != -1 {
			t.Fatalf("waiter %d could not join", i)
		}
	}
	if n := b.Waiting(""); n != 6 {
		t.Fatalf("Waiting = %d, want 6", n)
	}
	Release(at(1), &Request{Budget: b}, 1) // the first slot frees
	var order []int
	for range ws {
		// Every waiter tries; only the first is admitted, whatever the order they try in.
		admitted := -1
		for _, i := range rand.Perm(len(ws)) {
			if ws[i].seq == 0 {
				continue // admitted and gone
			}
			if _, d := Admit(at(1), reqs[i], nil); d == nil {
				if admitted >= 0 {
					t.Fatalf("two waiters admitted for one slot: %d and %d", admitted, i)
				}
				admitted = i
			}
		}
		if admitted < 0 {
			t.Fatalf("nobody admitted into a free slot; order so far %v", order)
		}
		order = append(order, admitted)
		Leave(&ws[admitted], reqs[admitted])
		for _, i := range order {
			_ = woken(&ws[i])
		}
		// The next waiter is woken once a slot frees.
		Release(at(2), &Request{Budget: b}, 1)
	}
	for i, got := range order {
		if got != i {
			t.Fatalf("admitted in order %v, want arrival order", order)
		}
	}
	if n := b.Waiting(""); n != 0 || b.waiters != 0 || len(b.queues) != 0 {
		t.Fatalf("queues not empty after all left: %d waiting, %d counted, %d queues", n, b.waiters, len(b.queues))
	}
}

func TestQueueNewcomerWaitsBehind(t *testing.T) {
	b := New(Spec{MaxConcurrent: 1, MaxQueue: 1})
	admit1(t, at(0), b, "", 0)
	var w Waiter
	req := []Request{{Budget: b}}
	_, d := Admit(at(0), req, nil)
	Join(&w, req, d)
	Release(at(1), &Request{Budget: b}, 1)
	if !woken(&w) {
		t.Fatal("a release did not wake the first waiter")
	}
	// The slot is free but the waiter has not taken it yet: a newcomer may not.
	_, d = Admit(at(1), []Request{{Budget: b}}, nil)
	if d == nil || !d.Queued || d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("a newcomer took the first waiter's slot: %+v", d)
	}
	// The release left room for the first waiter, which is leaving: it counts against the bound
	// (max 1) no more, and a second waiter joins behind it, as it would once the first took
	// its slot. A third finds the queue full.
	var w2 Waiter
	r2 := []Request{{Budget: b}}
	if Join(&w2, r2, d) != -1 {
		t.Fatal("a waiter could not join behind one that a release left room for")
	}
	var w3 Waiter
	if Join(&w3, []Request{{Budget: b}}, d) != 0 {
		t.Fatal("joined a full queue")
	}
	b.SetSpec(at(1), Spec{MaxConcurrent: 1, MaxQueue: 2}) // a reload makes room for one more
	r4 := []Request{{Budget: b}}
	var w4 Waiter
	if Join(&w4, r4, d) != -1 {
		t.Fatal("could not join a queue with room")
	}
	if _, d := Admit(at(1), req, nil); d != nil {
		t.Fatalf("the first waiter was refused a free slot: %+v", d)
	}
	Leave(&w, req)
	if !woken(&w2) {
		t.Fatal("leaving did not wake the next waiter")
	}
	Leave(&w2, r2)
	Leave(&w4, r4)
	if b.waiters != 0 {
		t.Fatalf("%d waiters counted after all left", b.waiters)
	}
}

// TestQueueBoundCountsWaitersNotTheOneLeaving: a release that does not make the first waiter's
// room (it needs two slots; one is freed) leaves it counting against the bound; one whose room
// the release made does not, until its try: held back again there, it counts again.
func TestQueueBoundCountsWaitersNotTheOneLeaving(t *testing.T) {
	b := New(Spec{MaxConcurrent: 2, MaxQueue: 1})
	admit1(t, at(0), b, "", 0)
	admit1(t, at(0), b, "", 0)
	var w Waiter
	req := []Request{{Budget: b}, {Budget: b}} // two slots of one key
	_, d := Admit(at(0), req, nil)
	if d == nil {
		t.Fatal("admitted into a full budget")
	}
	Join(&w, req, d)
	d.Index = 0                            // the one request of each Join below is the refused one
	Release(at(1), &Request{Budget: b}, 1) // one slot: not its room
	var w2 Waiter
	if Join(&w2, []Request{{Budget: b}}, d) != 0 {
		t.Fatal("joined a full queue: the first waiter, still without room, must count")
	}
	Release(at(1), &Request{Budget: b}, 1) // its room
	r3 := []Request{{Budget: b}}
	var w3 Waiter
	if Join(&w3, r3, d) != -1 {
		t.Fatal("the first waiter, leaving with its room, still counts against the bound")
	}
	Leave(&w3, r3)
	// At its try a health threshold holds it back: it waits on, and counts again.
	Hold(&w, req, &Denial{Reason: vocab.ReasonHealth})
	var w4 Waiter
	if Join(&w4, []Request{{Budget: b}}, d) != 0 {
		t.Fatal("held back at its try, the first waiter must count against the bound again")
	}
	Leave(&w, req)
}

func TestQueueSeveralBudgetsNoDeadlock(t *testing.T) {
	// Two waiters ask for A and B in opposite orders: the earlier is first in both queues.
	a := New(Spec{MaxConcurrent: 1, MaxQueue: 4})
	b := New(Spec{MaxConcurrent: 1, MaxQueue: 4})
	admit1(t, at(0), a, "", 0)
	admit1(t, at(0), b, "", 0)
	r1 := []Request{{Budget: a}, {Budget: b}}
	r2 := []Request{{Budget: b}, {Budget: a}}
	var w1, w2 Waiter
	_, d := Admit(at(0), r1, nil)
	Join(&w1, r1, d)
	_, d = Admit(at(0), r2, nil)
	Join(&w2, r2, d)
	Release(at(1), &Request{Budget: a}, 1)
	Release(at(1), &Request{Budget: b}, 1)
	if _, d := Admit(at(1), r2, nil); d == nil {
		t.Fatal("the later waiter was admitted before the earlier one")
	}
	if _, d := Admit(at(1), r1, nil); d != nil {
		t.Fatalf("the earlier waiter, first in both queues, was refused: %+v", d)
	}
	Leave(&w1, r1)
	Release(at(2), &Request{Budget: a}, 1)
	Release(at(2), &Request{Budget: b}, 1)
	if _, d := Admit(at(2), r2, nil); d != nil {
		t.Fatalf("the later waiter was refused once first: %+v", d)
	}
	Leave(&w2, r2)
}

// TestRejoinKeepsArrival: a waiter that leaves its queue and joins again without Forget (its
// statement decided again, the rules replaced while it waited) is back in its place of
// arrival, ahead of those that came after it; after Forget it joins at the back.
func TestRejoinKeepsArrival(t *testing.T) {
	b := New(Spec{MaxConcurrent: 1, MaxQueue: 8})
	why := &Denial{Reason: "concurrency"}
	reqs := func() []Request { return []Request{{Budget: b}} }
	var first, second Waiter
	r1, r2 := reqs(), reqs()
	if Join(&first, r1, why) >= 0 || Join(&second, r2, why) >= 0 {
		t.Fatal("a join was refused")
	}
	Leave(&first, r1)
	r1 = reqs()
	if Join(&first, r1, why) >= 0 {
		t.Fatal("the rejoin was refused")
	}
	if ws := b.queues[""].waiters(); len(ws) != 2 || ws[0] != &first {
		t.Fatalf("after a rejoin the first waiter is not first again: %v", ws)
	}
	Leave(&first, r1)
	first.Forget()
	r1 = reqs()
	Join(&first, r1, why)
	if ws := b.queues[""].waiters(); len(ws) != 2 || ws[0] != &second {
		t.Fatalf("after Forget a join did not go to the back: %v", ws)
	}
}

// TestQueueAdmittedWaiterCountsNoMore: a waiter admitted at its try (its room taken) is still in
// its queues until it leaves them (Leave, which its admission calls next): meanwhile it counts
// against the bound no more, as a newcomer would find once it left.
func TestQueueAdmittedWaiterCountsNoMore(t *testing.T) {
	b := New(Spec{MaxConcurrent: 1, MaxQueue: 1})
	first := admit1(t, at(0), b, "", 0)
	var w Waiter
	req := []Request{{Budget: b}}
	_, d := Admit(at(0), req, nil)
	Join(&w, req, d)
	Release(at(1), first, 1)
	if _, d := Admit(at(1), req, nil); d != nil { // its try: admitted, not left yet
		t.Fatalf("the first waiter was refused a free slot: %+v", d)
	}
	var w2 Waiter
	r2 := []Request{{Budget: b}}
	_, d = Admit(at(1), r2, nil)
	if d == nil {
		t.Fatal("a newcomer admitted into a slot taken")
	}
	if Join(&w2, r2, d) != -1 {
		t.Fatal("a newcomer refused as finding the queue full of a waiter admitted and leaving")
	}
	Leave(&w, req)
	Leave(&w2, r2)
}
