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
func admit1(t *testing.T, now time.Time, b *Budget, key string, cost float64) {
	t.Helper()
	if _, d := Admit(now, []Request{{Budget: b, Key: key, Cost: cost}}, nil); d != nil {
		t.Fatalf("Admit(%q, %v) denied: %+v", key, cost, *d)
	}
}

// charge leaves cost of debt on key with nothing in flight.
func charge(t *testing.T, now time.Time, b *Budget, key string, cost float64) {
	t.Helper()
	admit1(t, now, b, key, cost)
	b.Release(now, key, cost, cost)
}

// invariants checks the table and counters of b against each other.
func invariants(b *Budget) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	tb := &b.tab
	if len(tb.keys) != len(tb.heap) {
		return fmt.Errorf("map has %d keys, heap %d", len(tb.keys), len(tb.heap))
	}
	if _, ok := tb.keys[""]; ok {
		return fmt.Errorf(`key "" in the map; it belongs in unkeyed`)
	}
	inflight := 0
	if tb.hasUnkeyed {
		s := &tb.unkeyed
		if s.key != "" || s.idx != -1 {
			return fmt.Errorf("unkeyed state has key %q, idx %d", s.key, s.idx)
		}
		if err := stateInvariants(tb, s); err != nil {
			return err
		}
		inflight += int(s.inflight)
	} else if tb.unkeyed != (state{}) {
		return fmt.Errorf("unused unkeyed state %+v", tb.unkeyed)
	}
	// Heap order and priorities matter only once eviction can happen; below
	// the bound the heap may be stale, but then membership must still hold.
	if tb.stale && len(tb.keys) >= tb.maxKeys {
		return fmt.Errorf("stale heap in a full table (%d keys, bound %d)", len(tb.keys), tb.maxKeys)
	}
	for i, e := range tb.heap {
		s := e.s
		if !tb.stale && e.at != tb.prio(s) {
			return fmt.Errorf("heap[%d] priority %d, state's %d", i, e.at, tb.prio(s))
		}
		if int(s.idx) != i {
			return fmt.Errorf("heap[%d].idx = %d", i, s.idx)
		}
		if tb.keys[s.key] != s {
			return fmt.Errorf("heap[%d] (%q) not in map", i, s.key)
		}
		if !tb.stale && i > 0 && tb.heap[(i-1)/2].at > e.at {
			return fmt.Errorf("heap order broken at %d", i)
		}
		if err := stateInvariants(tb, s); err != nil {
			return err
		}
		inflight += int(s.inflight)
	}
	if inflight != b.inflight {
		return fmt.Errorf("in flight summed %d, counter %d", inflight, b.inflight)
	}
	if len(tb.keys) > tb.maxKeys && tb.heap[0].at != inFlightPrio {
		return fmt.Errorf("%d keys over bound %d with an evictable state", len(tb.keys), tb.maxKeys)
	}
	return nil
}

// stateInvariants checks one state of tb.
func stateInvariants(tb *table, s *state) error {
	if !(s.debt >= 0) {
		return fmt.Errorf("key %q debt %v", s.key, s.debt)
	}
	if s.inflight < 0 {
		return fmt.Errorf("key %q in flight %d", s.key, s.inflight)
	}
	if s.inflight == 0 && tb.rate > 0 {
		// emptyAt must follow the debt line within rounding.
		want := float64(s.last) + s.debt/tb.rate*1e9
		if at := tb.emptyAt(s); math.Abs(float64(at)-want) > 2 && at != maxEmptyAt {
			return fmt.Errorf("key %q emptyAt %d, want about %.0f", s.key, at, want)
		}
	}
	return nil
}

func mustInvariants(t testing.TB, b *Budget) {
	t.Helper()
	if err := invariants(b); err != nil {
		t.Fatal(err)
	}
}
