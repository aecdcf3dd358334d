package budget

import (
	"testing"
	"time"
)

// TestConcurrencyHintCountsTheTurnsAhead: a refusal for concurrency says when a slot is
// expected for the statement refused: with statements holding their slots 0.4 s on average
// and two slots, one turn is 0.2 s; a statement that needs two slots to free (one ahead of it
// in the same admission, as a waiter ahead of it in the queue would) waits two turns. Before,
// every refusal said one turn, and a statement behind a queue retried too early again and
// again.
func TestConcurrencyHintCountsTheTurnsAhead(t *testing.T) {
	b := New(Spec{MaxConcurrent: 2})
	Release(at(0.4), admit1(t, at(0), b, "", 0), 0)
	Release(at(0.4), admit1(t, at(0), b, "", 0), 0) // a mean hold of 0.4 s
	admit1(t, at(1), b, "", 0)
	admit1(t, at(1), b, "", 0)
	_, d := Admit(at(1), []Request{{Budget: b}}, nil)
	if d == nil || d.RetryAfter != 200*time.Millisecond {
		t.Fatalf("one statement over two slots held 0.4 s: %+v, want RetryAfter 200ms", d)
	}
	_, d = Admit(at(1), []Request{{Budget: b}, {Budget: b}}, nil)
	if d == nil || d.RetryAfter != 400*time.Millisecond {
		t.Fatalf("two statements over two slots held 0.4 s: %+v, want RetryAfter 400ms (the second's)", d)
	}
}
