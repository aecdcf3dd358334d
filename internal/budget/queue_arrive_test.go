package budget

import "testing"

// TestArriveKeepsThePlaceOfArrival: a waiter given its place of arrival (Arrive) before it first
// joins, as a statement the pool lends a connection to for its EXPLAIN is, joins ahead of one
// that arrived and joined while it was away, held to max_queue in arrival order: the later
// arrival is evicted, not the earlier refused.
func TestArriveKeepsThePlaceOfArrival(t *testing.T) {
	b := New(Spec{MaxConcurrent: 1, MaxQueue: 1})
	why := &Denial{Reason: "concurrency"}
	var first, later Waiter
	first.Arrive() // decided before its connection: no wait yet
	r2 := []Request{{Budget: b}}
	if Join(&later, r2, why) >= 0 {
		t.Fatal("the later arrival's join was refused")
	}
	r1 := []Request{{Budget: b}}
	if Join(&first, r1, why) >= 0 {
		t.Fatal("the earlier arrival was refused (queue full) behind a later one")
	}
	if got := b.queues[""].waiters(); len(got) != 1 || got[0] != &first {
		t.Errorf("queue %v, want the earlier arrival alone (max_queue 1)", got)
	}
	if l, _ := Evicted(&later, r2); l != 0 {
		t.Errorf("the later arrival: evicted %d, want 0", l)
	}
	if f, _ := Evicted(&first, r1); f != -1 {
		t.Errorf("the first arrival: evicted %d, want -1", f)
	}
	first.Arrive() // has a place: keeps it
	Leave(&later, r2)
	Leave(&first, r1)
	first.Forget()
	var third Waiter
	r3 := []Request{{Budget: b}}
	if Join(&third, r3, why) >= 0 {
		t.Fatal("join refused")
	}
	r1 = []Request{{Budget: b}}
	if Join(&first, r1, why) < 0 {
		t.Error("a forgotten waiter joined ahead of a full queue: a new admission takes a place at the back")
	}
}
