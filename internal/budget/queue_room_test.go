package budget

import (
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// TestQueueWaiterHoldsOnlyItsRoom: a statement of two budgets waits for the narrow one's slot;
// in the wide one, which has room for it, it holds only the slot it needs there: a newcomer of
// the wide budget alone takes a slot beyond it, and is refused, naming the wide budget's own
// limit, once only that slot is left.
func TestQueueWaiterHoldsOnlyItsRoom(t *testing.T) {
	all := New(Spec{MaxConcurrent: 3, MaxQueue: 8})
	reporting := New(Spec{MaxConcurrent: 1, MaxQueue: 8})
	report := func() []Request { return []Request{{Budget: all}, {Budget: reporting}} }
	running := report()
	if _, d := Admit(at(0), running, nil); d != nil {
		t.Fatalf("the first report: %+v", d)
	}
	var w Waiter
	waiting := report()
	_, d := Admit(at(0), waiting, nil)
	if d == nil || d.Index != 1 {
		t.Fatalf("the second report: %+v, want refused by reporting", d)
	}
	if Join(&w, waiting, d) != -1 {
		t.Fatal("the second report could not join")
	}
	if _, d := Admit(at(0), waiting, nil); d == nil || d.Index != 1 {
		t.Fatalf("the second report, tried again: %+v, want refused by reporting", d)
	}
	if _, d := Admit(at(0), []Request{{Budget: all}}, nil); d != nil {
		t.Fatalf("a statement of all alone, with a slot free beside the report's, was refused: %+v", d)
	}
	_, d = Admit(at(0), []Request{{Budget: all}}, nil)
	if d == nil || !d.Queued || d.Reason != vocab.ReasonConcurrency || d.Limit != "max_concurrent=3" {
		t.Fatalf("a statement of all took the slot the waiting report needs, or was told another's limit: %+v", d)
	}
	Release(at(1), &running[0], 1)
	Release(at(1), &running[1], 1)
	if !woken(&w) {
		t.Fatal("reporting's release did not wake its waiter")
	}
	if _, d := Admit(at(1), waiting, nil); d != nil {
		t.Fatalf("the waiting report was refused the room held for it: %+v", d)
	}
	Leave(&w, waiting)
	mustInvariants(t, all)
}

// TestQueueWakesBehindAWaiterForAnotherBudget: a release wakes, besides the first waiter, those
// behind it while the ones ahead of them wait for other budgets: the room is theirs.
func TestQueueWakesBehindAWaiterForAnotherBudget(t *testing.T) {
	all := New(Spec{MaxConcurrent: 3, MaxQueue: 8})
	reporting := New(Spec{MaxConcurrent: 1, MaxQueue: 8})
	admit1(t, at(0), reporting, "", 0)
	web := []Request{{Budget: all}}
	if _, d := Admit(at(0), web, nil); d != nil {
		t.Fatal(d)
	}
	admit1(t, at(0), all, "", 0)
	var w1, w2 Waiter
	r1 := []Request{{Budget: all}, {Budget: reporting}}
	_, d := Admit(at(0), r1, nil)
	Join(&w1, r1, d)
	Admit(at(0), r1, nil) // it fits all, and waits for reporting
	r2 := []Request{{Budget: all}}
	_, d = Admit(at(0), r2, nil)
	if d == nil || !d.Queued {
		t.Fatalf("all's last slot, held for the first waiter, went to a newcomer: %+v", d)
	}
	Join(&w2, r2, d)
	woken(&w1)
	woken(&w2)
	Release(at(1), &web[0], 1)
	if !woken(&w2) {
		t.Fatal("a slot of all released: the waiter for it, behind one waiting for reporting, was not woken")
	}
	if _, d := Admit(at(1), r2, nil); d != nil {
		t.Fatalf("the waiter for all's slot was refused it: %+v", d)
	}
	Leave(&w2, r2)
	Leave(&w1, r1)
}

// TestQueueHealthHoldsItsBudgetWhole: a waiter that a budget's health threshold holds back
// holds up that budget's key whole (a statement passing the threshold behind it would take its
// turn), and in its other budgets only the room it needs; once its try reaches the budgets'
// room, it holds up only that.
func TestQueueHealthHoldsItsBudgetWhole(t *testing.T) {
	a := New(Spec{MaxConcurrent: 4, MaxQueue: 8})
	b := New(Spec{MaxConcurrent: 4, MaxQueue: 8})
	var w Waiter
	reqs := []Request{{Budget: a}, {Budget: b}}
	if Join(&w, reqs, &Denial{Index: 0, Reason: vocab.ReasonConcurrency}) != -1 {
		t.Fatal("could not join")
	}
	Hold(&w, reqs, &Denial{Index: 1, Reason: vocab.ReasonHealth, Limit: "in_flight exceeded"})
	if _, d := Admit(at(0), []Request{{Budget: b}}, nil); d == nil || !d.Queued || d.Reason != vocab.ReasonHealth {
		t.Fatalf("a newcomer of b passed a waiter that b's health holds back: %+v", d)
	}
	if _, d := Admit(at(0), []Request{{Budget: a}}, nil); d != nil {
		t.Fatalf("a newcomer of a, with room beside the waiter, was refused: %+v", d)
	}
	if d := Check(at(0), reqs); d != nil {
		t.Fatalf("the waiter, past its health check, was refused: %+v", d)
	}
	if _, d := Admit(at(0), []Request{{Budget: b}}, nil); d != nil {
		t.Fatalf("a newcomer of b, with room beside the waiter past its health check, was refused: %+v", d)
	}
	Leave(&w, reqs)
}

// TestQueuedBucketRefusalSaysWhen: the bucket is empty, but the statement waiting ahead for it
// and a newcomer together exceed the burst. The newcomer is refused behind the waiter, and its
// RetryAfter is when it fits beside it (the waiter's cost drained enough), not zero, which
// would tell its caller that waiting cannot help.
func TestQueuedBucketRefusalSaysWhen(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 10, MaxQueue: 8})
	admit1(t, at(0), b, "", 10) // the bucket full
	var w Waiter
	ahead := []Request{{Budget: b, Cost: 8}}
	_, d := Admit(at(0), ahead, nil)
	if d == nil {
		t.Fatal("a cost of 8 fitted a full bucket")
	}
	if Join(&w, ahead, d) != -1 {
		t.Fatal("the waiter could not join")
	}
	// Ten seconds later the bucket is empty; the waiter has not tried again yet.
	_, d = Admit(at(10), []Request{{Budget: b, Cost: 5}}, nil)
	if d == nil || !d.Queued || d.Reason != vocab.ReasonBudget {
		t.Fatalf("a newcomer of cost 5 behind a waiter of cost 8, burst 10: %+v, want refused behind it for the bucket", d)
	}
	// Once the waiter is admitted (a debt of 8), the newcomer's 5 fits when 3 have drained.
	if want := 3 * time.Second; d.RetryAfter < want-time.Millisecond || d.RetryAfter > want+time.Millisecond {
		t.Errorf("RetryAfter %v, want %v: when it fits beside the waiter ahead", d.RetryAfter, want)
	}
	Leave(&w, ahead)
}
