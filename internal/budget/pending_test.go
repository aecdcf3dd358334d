package budget

import (
	"math"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// Pending slots: a request admitted before its statement had a connection (Request.Pending)
// holds a slot that connected requests may overtake, until Connect.

// counts are key's slots in flight and pending in b.
func counts(b *Budget, key string) (inflight, pending int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.keys.lookup(key); s != nil {
		return s.inflight, s.pending
	}
	return 0, 0
}

// debtAt is key's debt in b at now.
func debtAt(b *Budget, key string, now float64) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.keys.lookup(key)
	if s == nil {
		return 0
	}
	return s.DebtAt(at(now), b.keys.rate(s))
}

// admitted admits reqs at now and fails the test on a denial.
func admitted(t *testing.T, now float64, reqs ...Request) []Request {
	t.Helper()
	if _, d := Admit(at(now), reqs, nil); d != nil {
		t.Fatalf("Admit(%+v) denied: %+v", reqs, *d)
	}
	return reqs
}

// refused admits reqs at now, fails the test if they are admitted, and returns the denial.
func refused(t *testing.T, now float64, reqs ...Request) *Denial {
	t.Helper()
	_, d := Admit(at(now), reqs, nil)
	if d == nil {
		t.Fatalf("Admit(%+v) admitted; want a denial", reqs)
	}
	return d
}

func wantCounts(t *testing.T, b *Budget, key string, inflight, pending int) {
	t.Helper()
	mustInvariants(t, b)
	if i, p := counts(b, key); i != inflight || p != pending {
		t.Fatalf("key %q: %d in flight, %d pending; want %d, %d", key, i, p, inflight, pending)
	}
}

// TestPendingOvertaken: a connected request is held only to the running statements' slots,
// a pending one to every slot in flight.
func TestPendingOvertaken(t *testing.T) {
	b := New(Spec{MaxConcurrent: 1})
	p := admitted(t, 0, Request{Budget: b, Pending: true})
	wantCounts(t, b, "", 1, 1)
	if d := refused(t, 0, Request{Budget: b, Pending: true}); d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("a second pending request: %+v, want concurrency", d)
	}
	c := admitted(t, 0, Request{Budget: b}) // overtakes the pending slot
	wantCounts(t, b, "", 2, 1)
	if d := refused(t, 0, Request{Budget: b}); d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("a second connected request: %+v, want concurrency", d)
	}
	if d := refused(t, 0, Request{Budget: b, Pending: true}); d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("a pending request counts every slot: %+v, want concurrency", d)
	}
	Release(at(1), &c[0], 0)
	Release(at(1), &p[0], 0)
	wantCounts(t, b, "", 0, 0)
	// Keys apart: a pending slot of one key does not count for another.
	admitted(t, 2, Request{Budget: b, Key: "a", Pending: true})
	admitted(t, 2, Request{Budget: b, Key: "b", Pending: true})
	wantCounts(t, b, "a", 1, 1)
}

// TestConnect: a pending request that connects while there is room becomes a running one; one
// overtaken meanwhile gives its slot back, its reserved cost refunded, and is told so.
func TestConnect(t *testing.T) {
	b := New(Spec{MaxConcurrent: 1, Rate: 1, Burst: 10})
	p := admitted(t, 0, Request{Budget: b, Cost: 2, Pending: true})
	if !Connect(at(0), &p[0]) || p[0].Pending {
		t.Fatalf("Connect with room: pending %v; want true, no longer pending", p[0].Pending)
	}
	wantCounts(t, b, "", 1, 0)
	if d := refused(t, 0, Request{Budget: b}); d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("a connected request beside a connected one: %+v, want concurrency", d)
	}
	if !Connect(at(0), &p[0]) { // no longer pending: nothing changes
		t.Fatal("Connect of a connected request reported false")
	}
	wantCounts(t, b, "", 1, 0)
	Release(at(0), &p[0], 2)
	wantCounts(t, b, "", 0, 0)

	// Overtaken: the key's debt is 2 (charged above) + 2 (p) + 1 (c) = 5 at t=0.
	p = admitted(t, 0, Request{Budget: b, Cost: 2, Pending: true})
	c := admitted(t, 0, Request{Budget: b, Cost: 1})
	if got := debtAt(b, "", 0); math.Abs(got-5) > 1e-9 {
		t.Fatalf("debt %v, want 5", got)
	}
	if Connect(at(1), &p[0]) {
		t.Fatal("Connect of an overtaken request reported true: two statements would run in one slot")
	}
	if p[0].Pending {
		t.Fatal("a request that gave its slot back is still pending")
	}
	wantCounts(t, b, "", 1, 0)
	if got := debtAt(b, "", 1); math.Abs(got-2) > 1e-9 { // 5 drained by 1, p's 2 refunded
		t.Fatalf("debt after the slot went back %v, want 2", got)
	}
	// Admitted again, now connected: held to the running statement.
	again := Request{Budget: b, Cost: 2}
	if d := refused(t, 1, again); d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("admitted again beside the running one: %+v, want concurrency", d)
	}
	Release(at(1), &c[0], 1)
	admitted(t, 1, again)
	wantCounts(t, b, "", 1, 0)
}

// TestConnectNoConcurrencyLimit: without max_concurrent nothing can overtake a slot.
func TestConnectNoConcurrencyLimit(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 10})
	p := admitted(t, 0, Request{Budget: b, Cost: 1, Pending: true})
	admitted(t, 0, Request{Budget: b, Cost: 1})
	if !Connect(at(0), &p[0]) {
		t.Fatal("Connect without max_concurrent reported false")
	}
	wantCounts(t, b, "", 2, 0)
}

// TestReleasePending: a pending request released (its statement never got its connection)
// gives back its pending slot.
func TestReleasePending(t *testing.T) {
	b := New(Spec{MaxConcurrent: 2})
	p := admitted(t, 0, Request{Budget: b, Key: "k", Pending: true})
	wantCounts(t, b, "k", 1, 1)
	Release(at(1), &p[0], 0)
	wantCounts(t, b, "k", 0, 0)
	Release(at(1), &p[0], 0) // twice: nothing
	wantCounts(t, b, "k", 0, 0)
	// Pending and connected slots side by side, released in any order.
	p = admitted(t, 2, Request{Budget: b, Key: "k", Pending: true})
	c := admitted(t, 2, Request{Budget: b, Key: "k"})
	Release(at(3), &c[0], 0)
	wantCounts(t, b, "k", 1, 1)
	Release(at(3), &p[0], 0)
	wantCounts(t, b, "k", 0, 0)
}

// TestQueueBypassOnlyWithPending: while others wait for a key, a connected request passes them
// only when the key has pending slots (they may wait for those, held by statements waiting
// for its connection); with none the queue is first come, first served for everyone.
func TestQueueBypassOnlyWithPending(t *testing.T) {
	t.Run("no pending slot", func(t *testing.T) {
		b := New(Spec{MaxConcurrent: 1, MaxQueue: 8})
		c := admitted(t, 0, Request{Budget: b})
		var w Waiter
		u := []Request{{Budget: b, Pending: true}}
		if Join(&w, u, refused(t, 0, u...)) != -1 {
			t.Fatal("could not join")
		}
		if d := refused(t, 0, Request{Budget: b}); !d.Queued {
			t.Fatalf("a connected newcomer with nothing pending: %+v, want queued behind the waiter", d)
		}
		Release(at(1), &c[0], 0)
		if !woken(&w) {
			t.Fatal("the first waiter was not told of the free slot")
		}
		if d := refused(t, 1, Request{Budget: b}); !d.Queued {
			t.Fatalf("a connected newcomer took the slot the first waiter waits for: %+v", d)
		}
		admitted(t, 1, u...)
		Leave(&w, u)
		wantCounts(t, b, "", 1, 1)
	})
	t.Run("pending slot", func(t *testing.T) {
		b := New(Spec{MaxConcurrent: 1, MaxQueue: 8})
		admitted(t, 0, Request{Budget: b, Pending: true}) // waits for its connection
		var w Waiter
		u := []Request{{Budget: b, Pending: true}}
		if Join(&w, u, refused(t, 0, u...)) != -1 {
			t.Fatal("could not join")
		}
		if d := refused(t, 0, Request{Budget: b, Pending: true}); !d.Queued {
			t.Fatalf("a pending newcomer: %+v, want queued behind the waiter", d)
		}
		admitted(t, 0, Request{Budget: b}) // a connected newcomer passes the waiter
		wantCounts(t, b, "", 2, 1)
		d := refused(t, 0, Request{Budget: b})
		if d.Queued || d.Reason != vocab.ReasonConcurrency {
			t.Fatalf("a second connected newcomer: %+v, want concurrency (the running slot), not queued", d)
		}
		Leave(&w, u)
	})
}

// TestConnectedWaiterWoken: while the key has pending slots, a slot a running statement gives
// back wakes a connected waiter behind one waiting for a pending slot, which it passes.
func TestConnectedWaiterWoken(t *testing.T) {
	b := New(Spec{MaxConcurrent: 1, MaxQueue: 8})
	p := admitted(t, 0, Request{Budget: b, Pending: true})
	c := admitted(t, 0, Request{Budget: b})
	var wu, wc Waiter
	u := []Request{{Budget: b, Pending: true}}
	if Join(&wu, u, refused(t, 0, u...)) != -1 {
		t.Fatal("could not join")
	}
	conn := []Request{{Budget: b}}
	d := refused(t, 0, conn...)
	if d.Queued {
		t.Fatalf("a connected request was queued behind a waiter for a pending slot: %+v", d)
	}
	if Join(&wc, conn, d) != -1 {
		t.Fatal("could not join")
	}
	Release(at(1), &c[0], 0)
	if !woken(&wc) {
		t.Fatal("the connected waiter was not told of the running slot given back")
	}
	refused(t, 1, u...) // the pending slot still counts for it
	admitted(t, 1, conn...)
	Leave(&wc, conn)
	// An overtaken request's Connect gives its slot back and wakes the waiters too.
	if Connect(at(2), &p[0]) {
		t.Fatal("Connect of an overtaken request reported true")
	}
	if !woken(&wu) {
		t.Fatal("the waiter was not told of the slot given back by Connect")
	}
	wantCounts(t, b, "", 1, 0)
	Leave(&wu, u)
}

// TestPendingSameKey: an admission of several requests for the same key takes as many pending
// slots; each connects on its own, and one past max_concurrent gives its slot back.
func TestPendingSameKey(t *testing.T) {
	b := New(Spec{MaxConcurrent: 2})
	if d := refused(t, 0, Request{Budget: b, Pending: true}, Request{Budget: b, Pending: true},
		Request{Budget: b, Pending: true}); d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("three slots of two: %+v", d)
	}
	p := admitted(t, 0, Request{Budget: b, Pending: true}, Request{Budget: b, Pending: true})
	wantCounts(t, b, "", 2, 2)
	// Two connected requests of one admission pass both pending slots; a third does not fit.
	if d := refused(t, 0, Request{Budget: b}, Request{Budget: b}, Request{Budget: b}); d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("three connected slots of two: %+v", d)
	}
	c := admitted(t, 0, Request{Budget: b})
	wantCounts(t, b, "", 3, 2)
	if !Connect(at(1), &p[0]) { // running: c and p[0]
		t.Fatal("the first of the admission could not connect")
	}
	if Connect(at(1), &p[1]) { // running: c, p[0] and p[1], one past the limit
		t.Fatal("the second of the admission connected past max_concurrent")
	}
	wantCounts(t, b, "", 2, 0)
	Release(at(2), &p[0], 0)
	Release(at(2), &c[0], 0)
	wantCounts(t, b, "", 0, 0)
}

// TestPendingConnectedWaitersInOrder: while a key has a pending slot, a connected request
// passes the waiters that hold no connection but not the connected ones ahead of it; the first
// connected waiter is woken when a slot becomes pending and when a running slot frees, and the
// next one when it leaves.
func TestPendingConnectedWaitersInOrder(t *testing.T) {
	b := New(Spec{MaxConcurrent: 1, MaxQueue: 8})
	running := admitted(t, 0, Request{Budget: b}) // a connected statement holds the slot
	join := func(pending bool) (*Waiter, []Request) {
		t.Helper()
		w, reqs := &Waiter{}, []Request{{Budget: b, Pending: pending}}
		d := refused(t, 0, reqs...)
		if Join(w, reqs, d) != -1 {
			t.Fatal("could not join")
		}
		return w, reqs
	}
	wp, rp := join(true)  // a pool statement, first
	w1, r1 := join(false) // then two statements on held connections
	w2, r2 := join(false)
	Release(at(1), &running[0], 0)
	if !woken(wp) || woken(w1) {
		t.Fatal("a running slot freed with no pending slot: want the first waiter woken alone")
	}
	admitted(t, 1, rp...) // the pool statement takes a pending slot
	Leave(wp, rp)
	if !woken(w1) || woken(w2) {
		t.Fatal("a slot became pending: want the first connected waiter woken, not the second")
	}
	if d := refused(t, 1, r2...); !d.Queued {
		t.Fatalf("the second connected waiter passed the first: %+v", d)
	}
	held := admitted(t, 1, r1...) // passes the pending slot, not an earlier connected waiter
	Leave(w1, r1)
	if !woken(w2) {
		t.Fatal("the first connected waiter left: want the next one woken")
	}
	Release(at(2), &held[0], 0)
	if !woken(w2) {
		t.Fatal("a running slot freed while a slot is pending: want the first connected waiter woken")
	}
	admitted(t, 2, r2...)
	Leave(w2, r2)
	wantCounts(t, b, "", 2, 1)
}

// TestPendingCostOvertaken: a connected request is held to the running statements' debt, not to
// the cost that pending requests reserved (their statements may wait for the very connection
// its statement holds), as it is to their slots; a pending request counts all of it. The cost
// leaves the pending count when its request connects or is released.
func TestPendingCostOvertaken(t *testing.T) {
	b := New(Spec{Rate: 0.05, Burst: 1})
	p := admitted(t, 0, Request{Budget: b, Cost: 0.6, Pending: true})
	if d := refused(t, 0, Request{Budget: b, Cost: 0.6, Pending: true}); d.Reason != vocab.ReasonBudget {
		t.Fatalf("a second pending request: %+v, want budget", d)
	}
	c := admitted(t, 0, Request{Budget: b, Cost: 0.6}) // the pending reservation is not in its way
	if d := refused(t, 0, Request{Budget: b, Cost: 0.6}); d.Reason != vocab.ReasonBudget {
		t.Fatalf("a second connected request: %+v, want budget (the first one's debt counts)", d)
	}
	Release(at(0.1), &c[0], 0.6)
	if !Connect(at(0.1), &p[0]) {
		t.Fatal("the pending request was overtaken; there is no max_concurrent")
	}
	// Connected, its reservation is the running statements' debt like any other.
	if d := refused(t, 0.1, Request{Budget: b, Cost: 0.6}); d.Reason != vocab.ReasonBudget {
		t.Fatalf("a connected request after the pending one connected: %+v, want budget", d)
	}
	Release(at(0.2), &p[0], 0.6)
	b.mu.Lock()
	left := b.keys.lookup("").pendingCost
	b.mu.Unlock()
	if left != 0 {
		t.Fatalf("pending cost %v with nothing pending", left)
	}
}

// TestNoBucketNoDebt: a budget without a bucket (max_concurrent alone) keeps no debt, though
// its statements are priced for another budget that selects them too: its status shows none,
// and a reload that gives it a bucket starts that bucket empty, its first statement admitted.
func TestNoBucketNoDebt(t *testing.T) {
	b := New(Spec{MaxConcurrent: 4})
	for range 10 {
		r := admitted(t, 0, Request{Budget: b, Key: "a", Cost: 2})
		Release(at(1), &r[0], 2)
	}
	if got := b.Snapshot(at(1)).Debt; got != 0 {
		t.Fatalf("a budget without a bucket shows %v s of debt, want 0", got)
	}
	b.SetSpec(at(1), Spec{MaxConcurrent: 4, Rate: 0.5, Burst: 1})
	if _, d := Admit(at(1), []Request{{Budget: b, Key: "a", Cost: 0.5}}, nil); d != nil {
		t.Fatalf("the first statement under a bucket just added was refused: %+v", *d)
	}
}
