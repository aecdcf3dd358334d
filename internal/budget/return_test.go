package budget

import (
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// TestReturnLearnsNoHold: a refusal for concurrency hints the mean time a slot is held
// (divided over the slots). Statements that never ran (given back by Return: abandoned while
// they waited for a connection, refused after all) are not holds: thirty of them leave the
// hint where the statements that ran put it, and their slots and reserved cost come back.
func TestReturnLearnsNoHold(t *testing.T) {
	b := New(Spec{MaxConcurrent: 1, Rate: 1, Burst: 10})
	now := t0
	for range 20 {
		r := admit1(t, now, b, "", 0.3)
		now = now.Add(300 * time.Millisecond)
		Release(now, r, 0.3)
	}
	r := admit1(t, now, b, "", 0.3)
	_, d := Admit(now, []Request{{Budget: b, Cost: 0.3}}, nil)
	if d == nil {
		t.Fatal("a second statement was admitted beside the first under max_concurrent: 1")
	}
	before := d.RetryAfter
	now = now.Add(300 * time.Millisecond)
	Release(now, r, 0.3)
	for range 30 {
		admit1(t, now, b, "", 0.3)
		Return(now, &Request{Budget: b, Cost: 0.3})
	}
	admit1(t, now, b, "", 0.3)
	_, d = Admit(now, []Request{{Budget: b, Cost: 0.3}}, nil)
	if d == nil {
		t.Fatal("a second statement was admitted beside the first after the returns")
	}
	if d.RetryAfter != before {
		t.Errorf("RetryAfter %v after thirty statements that never ran, want %v as before them", d.RetryAfter, before)
	}
	if before < 250*time.Millisecond {
		t.Errorf("RetryAfter %v for 300 ms holds on one slot, want about 300ms", before)
	}
	if err := invariants(b); err != nil {
		t.Fatal(err)
	}
}

// TestHintFollowsHoldTime: the concurrency hint is learned from how long a slot was held, not
// from what its statement was charged, which on the server's clock is the server's time alone
// (a lookup held half a second by its client, charged a tenth of a millisecond).
func TestHintFollowsHoldTime(t *testing.T) {
	b := New(Spec{MaxConcurrent: 1})
	for i := range 20 {
		r := admit1(t, at(float64(i)), b, "", 0)
		Release(at(float64(i)+0.5), r, 0.0001)
	}
	admit1(t, at(30), b, "", 0)
	_, d := Admit(at(30), []Request{{Budget: b}}, nil)
	if d == nil || d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("a second statement under max_concurrent: 1: %+v", d)
	}
	if d.RetryAfter < 400*time.Millisecond || d.RetryAfter > 500*time.Millisecond {
		t.Errorf("RetryAfter %v after holds of 500ms charged 100µs, want about 500ms", d.RetryAfter)
	}
}
