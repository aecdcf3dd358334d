package budget

import (
	"fmt"
	"math"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

// at is t0 plus sec seconds.
func at(sec float64) time.Time { return t0.Add(time.Duration(math.Round(sec * 1e9))) }

// admit1 admits one request and fails the test on a denial.
func admit1(t *testing.T, now time.Time, b *Budget, key string, cost float64) *Request {
	t.Helper()
	reqs := []Request{{Budget: b, Key: key, Cost: cost}}
	if _, d := Admit(now, reqs, nil); d != nil {
		t.Fatalf("Admit(%q, %v) denied: %+v", key, cost, *d)
	}
	return &reqs[0]
}

// charge leaves cost of debt on key with nothing in flight.
func charge(t *testing.T, now time.Time, b *Budget, key string, cost float64) {
	t.Helper()
	admit1(t, now, b, key, cost)
	Release(now, &Request{Budget: b, Key: key, Cost: cost}, cost)
}

// invariants checks the table and counters of b against each other.
func invariants(b *Budget) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := &b.keys
	if _, ok := k.byKey[""]; ok {
		return fmt.Errorf(`key "" in the map; it belongs in unkeyed`)
	}
	inflight, idle := 0, 0
	for _, s := range k.all() {
		if !(s.Debt >= 0) {
			return fmt.Errorf("key %q debt %v", s.key, s.Debt)
		}
		if s.inflight < 0 {
			return fmt.Errorf("key %q in flight %d", s.key, s.inflight)
		}
		if s.pending < 0 || s.pending > s.inflight {
			return fmt.Errorf("key %q: %d pending of %d in flight", s.key, s.pending, s.inflight)
		}
		inflight += s.inflight
		if s == k.unkeyed {
			if s.idx != -1 {
				return fmt.Errorf("unkeyed state in the idle heap at %d", s.idx)
			}
			continue
		}
		if (s.inflight == 0) != (s.idx >= 0) {
			return fmt.Errorf("key %q: %d in flight, heap index %d", s.key, s.inflight, s.idx)
		}
		if s.idx >= 0 {
			idle++
			if k.idle[s.idx] != s {
				return fmt.Errorf("key %q not at its heap index %d", s.key, s.idx)
			}
		}
	}
	if idle != len(k.idle) {
		return fmt.Errorf("%d idle states, heap holds %d", idle, len(k.idle))
	}
	for i := 1; i < len(k.idle); i++ {
		if k.idle[i].emptyAt.Before(k.idle[(i-1)/2].emptyAt) {
			return fmt.Errorf("heap order broken at %d", i)
		}
	}
	if inflight != k.inflight {
		return fmt.Errorf("in flight summed %d, counter %d", inflight, k.inflight)
	}
	if len(k.byKey) > k.spec.MaxKeys && len(k.idle) > 0 {
		return fmt.Errorf("%d keys over bound %d with an evictable state", len(k.byKey), k.spec.MaxKeys)
	}
	return nil
}

func mustInvariants(t testing.TB, b *Budget) {
	t.Helper()
	if err := invariants(b); err != nil {
		t.Fatal(err)
	}
}

// waiters is q's waiters, in their order.
func (q *queue) waiters() []*Waiter {
	var ws []*Waiter
	if q == nil {
		return nil
	}
	for _, p := range q.ps {
		ws = append(ws, p.w)
	}
	return ws
}
