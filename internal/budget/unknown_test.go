package budget

import (
	"fmt"
	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"math"
	"testing"
	"time"
)

// TestUnknownCostReserved: a request of unknown cost reserves a slot's share of the burst, one
// share kept back (at most per_query_limit) whatever its guess, Admit writes what it reserved into the request,
// and Release trues it up to the actual cost.
func TestUnknownCostReserved(t *testing.T) {
	tests := []struct {
		name  string
		spec  Spec
		guess float64
		want  float64
	}{
		{"a slot's share of the burst", Spec{Rate: 1, Burst: 10, MaxConcurrent: 99}, 0, 0.1},
		{"no max_concurrent", Spec{Rate: 1, Burst: 10}, 0, 10.0 / (coldSlots + 1)},
		{"per_query_limit caps it", Spec{Rate: 1, Burst: 10, PerQueryLimit: 0.05}, 0, 0.05},
		{"a guess is not reserved", Spec{Rate: 1, Burst: 10, MaxConcurrent: 99}, 30, 0.1},
		{"no bucket reserves nothing", Spec{MaxConcurrent: 4}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := New(tt.spec)
			reqs := []Request{{Budget: b, Cost: tt.guess, Unknown: true}}
			if _, d := Admit(at(0), reqs, nil); d != nil {
				t.Fatalf("denied: %+v", *d)
			}
			if math.Abs(reqs[0].Cost-tt.want) > 1e-12 {
				t.Fatalf("reserved %v, want %v", reqs[0].Cost, tt.want)
			}
			if tt.spec.Rate > 0 {
				if debt := b.Snapshot(at(0)).Debt; math.Abs(debt-tt.want) > 1e-12 {
					t.Fatalf("debt %v after admission, want %v", debt, tt.want)
				}
			}
			Release(at(0), &reqs[0], 0.02)
			if s := b.Snapshot(at(0)); s.InFlight != 0 || (tt.spec.Rate > 0 && math.Abs(s.Debt-0.02) > 1e-12) {
				t.Fatalf("after Release: %+v, want nothing in flight and the actual 0.02 of debt", s)
			}
			mustInvariants(t, b)
		})
	}
}

// TestUnknownCostNeverNeverFits: statements of unknown cost fill a budget until it has no
// room, and are then refused only to wait (reason budget or concurrency, a positive
// RetryAfter), never as a cost that can never fit, whatever the budget's limits.
func TestUnknownCostNeverNeverFits(t *testing.T) {
	for _, spec := range []Spec{
		{Rate: 0.5},              // the default burst with a share below 1
		{Rate: 0.5, Burst: 0.01}, // a burst smaller than most statements
		{Rate: 1, Burst: 1, MaxConcurrent: 1},
		{Rate: 1, Burst: 2, PerQueryLimit: 3},
		{Rate: 1, Burst: 2, PerQueryLimit: 0.001, MaxConcurrent: 3},
	} {
		b := New(spec)
		admitted := 0
		for range 300 {
			reqs := []Request{{Budget: b, Unknown: true}}
			_, d := Admit(at(0), reqs, nil)
			if d == nil {
				admitted++
				continue
			}
			if d.Reason == vocab.ReasonPerQuery || d.RetryAfter <= 0 {
				t.Fatalf("%+v: an unknown cost refused with %+v; want a wait for room", spec, *d)
			}
		}
		if admitted == 0 || admitted == 300 {
			t.Fatalf("%+v: %d of 300 admitted, want some and not all", spec, admitted)
		}
		mustInvariants(t, b)
	}
}

// TestUnknownCostGuessAbovePerQueryLimit: per_query_limit still judges the guess of an
// unknown cost, the planner's view of an enormous plan: refused before it runs.
func TestUnknownCostGuessAbovePerQueryLimit(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 10, PerQueryLimit: 2})
	_, d := Admit(at(0), []Request{{Budget: b, Cost: 5, Unknown: true}}, nil)
	if d == nil || d.Reason != vocab.ReasonPerQuery || d.RetryAfter != 0 {
		t.Fatalf("denial %+v, want per_query_limit", d)
	}
}

// TestUnknownCostCutToRoom: with less room left than its reservation (one slot, whose share
// is half the burst, after a statement left a little debt), an unknown cost reserves its share
// of the room (half) instead of being refused; with no room left it is refused to wait for room.
func TestUnknownCostCutToRoom(t *testing.T) {
	b := New(Spec{Rate: 0.02, Burst: 2, MaxConcurrent: 1})
	charge(t, at(0), b, "", 1.005)
	reqs := []Request{{Budget: b, Unknown: true}}
	if _, d := Admit(at(0), reqs, nil); d != nil {
		t.Fatalf("refused with room left: %+v", *d)
	}
	if math.Abs(reqs[0].Cost-0.4975) > 1e-12 {
		t.Fatalf("reserved %v, want half the room left, 0.4975", reqs[0].Cost)
	}
	Release(at(0), &reqs[0], 0.2)
	mustInvariants(t, b)

	full := New(Spec{Rate: 1, Burst: 1})
	charge(t, at(0), full, "", 1)
	_, d := Admit(at(0), []Request{{Budget: full, Unknown: true}}, nil)
	if d == nil || d.Reason != vocab.ReasonBudget || d.RetryAfter <= 0 {
		t.Fatalf("a full bucket: %+v, want a wait for room", d)
	}
}

// TestUnknownCostsLeaveRoomToEachOther: at a cold start every statement's cost is unknown, and
// its reservation a guess trued up when it ends. Statements of unknown cost in flight together
// must not fill with their guesses a bucket that their real costs leave room in: with half the
// burst owed for what ran, every slot of max_concurrent still admits one.
func TestUnknownCostsLeaveRoomToEachOther(t *testing.T) {
	b := New(Spec{Rate: 1e-9, Burst: 1, MaxConcurrent: 4})
	ran := []Request{{Budget: b, Cost: 0.5}}
	if _, d := Admit(at(0), ran, nil); d != nil {
		t.Fatal(d)
	}
	Release(at(0), &ran[0], 0.5)
	held := make([]Request, 0, 4)
	for i := range 4 {
		reqs := []Request{{Budget: b, Unknown: true}}
		if _, d := Admit(at(0), reqs, nil); d != nil {
			t.Fatalf("statement %d of unknown cost, with %d in flight and half the burst owed: refused %+v", i+1, i, *d)
		}
		held = append(held, reqs[0])
	}
	for i := range held {
		Release(at(0), &held[i], 0.01)
	}
	mustInvariants(t, b)
}

// TestUnknownCostLeavesRoomForKnownCosts: a statement of unknown cost that takes the last free
// slot must not reserve all the room left, or a statement of known cost that follows into a slot
// freed beside it (a little dearer than predicted, as real costs are) finds the bucket full
// although what ran used half of it: a deploy's new patterns would refuse the warm ones.
func TestUnknownCostLeavesRoomForKnownCosts(t *testing.T) {
	b := New(Spec{Rate: 1e-9, Burst: 1, MaxConcurrent: 4})
	ran := []Request{{Budget: b, Cost: 0.5}}
	if _, d := Admit(at(0), ran, nil); d != nil {
		t.Fatal(d)
	}
	Release(at(0), &ran[0], 0.5)
	admit := func(what string, r Request) Request {
		t.Helper()
		reqs := []Request{r}
		if _, d := Admit(at(0), reqs, nil); d != nil {
			t.Fatalf("%s, the bucket at %.3f of its burst of 1: refused %+v", what, b.keys.lookup("").Debt, *d)
		}
		return reqs[0]
	}
	cold := []Request{admit("the first of unknown cost", Request{Budget: b, Unknown: true}),
		admit("the second of unknown cost", Request{Budget: b, Unknown: true})}
	warm := admit("one of known cost", Request{Budget: b, Cost: 0.01})
	cold = append(cold, admit("the third of unknown cost, in the last free slot", Request{Budget: b, Unknown: true}))
	for i := range 5 { // the known pattern runs on in its slot, beside the cold ones
		Release(at(0), &warm, 0.012)
		warm = admit(fmt.Sprintf("statement %d of known cost 0.01", i+2), Request{Budget: b, Cost: 0.01})
	}
	Release(at(0), &warm, 0.01)
	for i := range cold {
		Release(at(0), &cold[i], 0.01)
	}
	mustInvariants(t, b)
}

// TestUnknownCostRetryAfterIsRoom: a statement of unknown cost refused by a full bucket fits the
// moment the bucket has any room (it then reserves its share of that room), so its RetryAfter is
// when the debt falls below the burst, not when a whole share of the burst is free: a waiter
// sleeping on the longer hint leaves the budget idle with room while it and those queued behind
// it wait.
func TestUnknownCostRetryAfterIsRoom(t *testing.T) {
	b := New(Spec{Rate: 0.05, Burst: 1, MaxConcurrent: 2}) // a cold share of 1/3
	ran := []Request{{Budget: b, Unknown: true}}
	if _, d := Admit(at(0), ran, nil); d != nil {
		t.Fatal(*d)
	}
	Release(at(0), &ran[0], 1.3) // 0.3 past the burst: room in 6 s
	reqs := []Request{{Budget: b, Unknown: true}}
	_, d := Admit(at(0), reqs, nil)
	if d == nil || d.Reason != vocab.ReasonBudget {
		t.Fatalf("a bucket past its burst: %+v, want a wait for room", d)
	}
	if want := 6 * time.Second; d.RetryAfter < want || d.RetryAfter > want+time.Millisecond {
		t.Fatalf("RetryAfter %v, want about %v (when the debt falls below the burst)", d.RetryAfter, want)
	}
	at6 := at(0).Add(d.RetryAfter)
	if _, d := Admit(at6, reqs, nil); d != nil {
		t.Fatalf("at its RetryAfter the statement of unknown cost is refused again: %+v", *d)
	}
	Release(at6, &reqs[0], 0.01)
	mustInvariants(t, b)
}
