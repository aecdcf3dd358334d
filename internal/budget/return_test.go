package budget

import (
	"testing"
	"time"
)

// TestReturnLearnsNoHold: a refusal for concurrency hints the mean time a slot is held
// (divided over the slots). Statements that never ran (given back by Return: abandoned while
// they waited for a connection, refused after all) are not holds: thirty of them leave the
// hint where the statements that ran put it, and their slots and reserved cost come back.
func TestReturnLearnsNoHold(t *testing.T) {
	b := New(Spec{MaxConcurrent: 1, Rate: 1, Burst: 10})
	now := t0
	for range 20 {
		admit1(t, now, b, "", 0.3)
		now = now.Add(300 * time.Millisecond)
		Release(now, &Request{Budget: b, Cost: 0.3}, 0.3)
	}
	admit1(t, now, b, "", 0.3)
	_, d := Admit(now, []Request{{Budget: b, Cost: 0.3}}, nil)
	if d == nil {
		t.Fatal("a second statement was admitted beside the first under max_concurrent: 1")
	}
	before := d.RetryAfter
	Release(now, &Request{Budget: b, Cost: 0.3}, 0.3)
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
