package budget

import "testing"

// A waiter that left its queue at a reload and rejoins (no Forget) should keep its place of
// arrival; with max_queue reached by a later arrival during the gap it is refused instead,
// while the later one stays queued.
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
	if a.queues[""].ws[0] != &w1 || c.queues[""].ws[0] != &w1 {
		t.Fatalf("w1 not first in both")
	}
	if a.queues[""].ws[1] != &w2 || c.queues[""].ws[1] != &w2 || c.queues[""].ws[2] != &w3 {
		t.Fatalf("order broken")
	}
}
