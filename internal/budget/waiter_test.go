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
