package budget

import (
	"testing"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// TestQueueRoomLeftBeyondAWaiterThatStopsWaitingWakesTheNext: waiters are admitted in arrival
// order the moment there is room, with no idle gap, and a statement of several budgets holds
// only the room it needs in a budget that has room for it.
//
// all (max_concurrent 2) is full, reporting (max_concurrent 1) is full. w1 (all + reporting)
// waits for all's slot; w2 (all alone) waits behind it. Both of all's slots are released
// before w1 tries again (two statements ending together): each release wakes w1 only, as it
// waits for all. w1 tries: all now has room for it, reporting has none, so it waits for
// reporting, holding one of all's two free slots. The other is w2's room: w1's place, which
// stopped waiting for all, wakes w2 to take it, rather than leave it idle until w1 leaves or
// w2's max_wait ends.
func TestQueueRoomLeftBeyondAWaiterThatStopsWaitingWakesTheNext(t *testing.T) {
	all := New(Spec{MaxConcurrent: 2, MaxQueue: 8})
	reporting := New(Spec{MaxConcurrent: 1, MaxQueue: 8})
	admit1(t, at(0), reporting, "", 0)
	run1, run2 := []Request{{Budget: all}}, []Request{{Budget: all}}
	for _, r := range [][]Request{run1, run2} {
		if _, d := Admit(at(0), r, nil); d != nil {
			t.Fatal(d)
		}
	}
	var w1, w2 Waiter
	r1 := []Request{{Budget: all}, {Budget: reporting}}
	_, d := Admit(at(0), r1, nil)
	if d == nil {
		t.Fatal("w1 admitted into full budgets")
	}
	if Join(&w1, r1, d) != -1 {
		t.Fatal("w1 could not join")
	}
	if _, d := Admit(at(0), r1, nil); d == nil { // its try after joining: refused by both
		t.Fatal("w1 admitted")
	}
	r2 := []Request{{Budget: all}}
	_, d = Admit(at(0), r2, nil)
	if d == nil {
		t.Fatal("w2 admitted into a full budget")
	}
	if Join(&w2, r2, d) != -1 {
		t.Fatal("w2 could not join")
	}
	if _, d := Admit(at(0), r2, nil); d == nil {
		t.Fatal("w2 admitted")
	}
	woken(&w1)
	woken(&w2)

	// Both of all's statements end before w1's goroutine runs.
	Release(at(1), &run1[0], 1)
	Release(at(1), &run2[0], 1)
	w2Woken := woken(&w2)
	if !woken(&w1) {
		t.Fatal("all's releases did not wake w1, first in its queue")
	}
	if _, d := Admit(at(1), r1, nil); d == nil || d.Index != 1 {
		t.Fatalf("w1, tried again: %+v, want refused by reporting alone", d)
	}
	w2Woken = w2Woken || woken(&w2)
	// w2 fits now: all has 2 free slots, w1 holds 1 of them.
	_, fits := Admit(at(1), r2, nil)
	if fits != nil {
		t.Fatalf("w2 does not fit beside w1: %+v", fits)
	}
	if !w2Woken {
		t.Error("all has a free slot beyond the one w1 holds, and w2 waits for it, but nothing woke w2: it sleeps until its max_wait")
	}
	Leave(&w2, r2)
	Leave(&w1, r1)
}

// TestQueueWaiterNoLongerHeldBackByHealthWakesTheNext: a waiter held back by a budget's health
// threshold holds up that budget's waiters behind it; once another budget's threshold holds it
// back instead, it holds only the room it needs in the first, and the waiters behind it there
// are woken to take the rest.
func TestQueueWaiterNoLongerHeldBackByHealthWakesTheNext(t *testing.T) {
	all := New(Spec{MaxConcurrent: 2, MaxQueue: 8})
	reporting := New(Spec{MaxConcurrent: 1, MaxQueue: 8})
	var w1, w2 Waiter
	r1 := []Request{{Budget: all}, {Budget: reporting}}
	if Join(&w1, r1, &Denial{Index: 0, Reason: vocab.ReasonHealth}) != -1 {
		t.Fatal("w1 could not join")
	}
	r2 := []Request{{Budget: all}}
	_, d := Admit(at(0), r2, nil)
	if d == nil || !d.Queued || d.Reason != vocab.ReasonHealth {
		t.Fatalf("w2: %+v, want refused behind w1, held back by all's health", d)
	}
	if Join(&w2, r2, d) != -1 {
		t.Fatal("w2 could not join")
	}
	if _, d := Admit(at(0), r2, nil); d == nil {
		t.Fatal("w2 admitted past w1")
	}
	woken(&w1)
	woken(&w2)

	Hold(&w1, r1, &Denial{Index: 1, Reason: vocab.ReasonHealth})
	if !woken(&w2) {
		t.Error("w1 is held back by reporting's health now, not all's, but nothing woke w2")
	}
	if _, d := Admit(at(0), r2, nil); d != nil {
		t.Errorf("w2 beside w1: %+v, want admitted", d)
	}
	Leave(&w2, r2)
	Leave(&w1, r1)
}
