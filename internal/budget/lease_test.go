package budget

import (
	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"math"
	"testing"
	"time"
)

// newShared returns a shared budget of spec and a counter of its kicks.
func newShared(spec Spec) (*Budget, *int) {
	b := New(spec)
	kicks := new(int)
	b.SetShared(t0, nil, func() { *kicks++ }, 50*time.Millisecond)
	return b, kicks
}

func TestSharedWithoutLeaseRefusesAndKicks(t *testing.T) {
	b, kicks := newShared(Spec{Rate: 1, Burst: 1, MaxConcurrent: 4})
	_, d := Admit(at(0), []Request{{Budget: b, Key: "t1", Cost: 0.1}}, nil)
	if d == nil || d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("no lease: got %+v, want a concurrency refusal (no slot)", d)
	}
	if *kicks != 1 {
		t.Errorf("kicks = %d, want 1", *kicks)
	}
	u := b.TakeUsage(at(0), nil)
	if len(u) != 1 || u[0].Key != "t1" || u[0].Offered != 0.1 || !u[0].Starved || u[0].Wanted != 1 {
		t.Fatalf("usage = %+v, want t1 offered 0.1, starved, wanted 1", u)
	}
	if u := b.TakeUsage(at(0), nil); len(u) != 0 {
		t.Errorf("usage after a take = %+v, want none", u)
	}
	mustInvariants(t, b)
}

func TestSharedNoCreditRetriesAtTheHint(t *testing.T) {
	b, _ := newShared(Spec{Rate: 1, Burst: 1})
	_, d := Admit(at(0), []Request{{Budget: b, Cost: 0.1}}, nil)
	if d == nil || d.Reason != vocab.ReasonBudget || d.RetryAfter != 50*time.Millisecond {
		t.Fatalf("got %+v, want a budget refusal with RetryAfter 50ms", d)
	}
}

func TestSharedAdmitsWithinItsLease(t *testing.T) {
	b, kicks := newShared(Spec{Rate: 1, Burst: 1})
	b.SetLease(at(0), "", Lease{Rate: 0.25, Burst: 0.25})
	charge(t, at(0), b, "", 0.2)
	_, d := Admit(at(0), []Request{{Budget: b, Cost: 0.1}}, nil)
	if d == nil || d.Reason != vocab.ReasonBudget {
		t.Fatalf("past the lease's burst: got %+v, want a budget refusal", d)
	}
	// 0.05 over the lease's 0.25 drains at its rate 0.25/s: 200ms.
	if d.RetryAfter != 200*time.Millisecond {
		t.Errorf("RetryAfter = %v, want 200ms", d.RetryAfter)
	}
	if *kicks != 1 {
		t.Errorf("kicks = %d, want 1", *kicks)
	}
	admit1(t, at(0.2), b, "", 0.1)
	u := b.TakeUsage(at(0.2), nil)
	if len(u) != 1 || u[0].Offered < 0.4-1e-9 || u[0].Used != 0.2 || u[0].InFlight != 1 {
		t.Fatalf("usage = %+v, want offered 0.4, used 0.2, 1 in flight", u)
	}
	// 0.2 drained at 0.25/s for 200ms, and the 0.1 just admitted.
	if math.Abs(u[0].Debt-0.25) > 1e-9 {
		t.Fatalf("usage debt = %v, want 0.25", u[0].Debt)
	}
	mustInvariants(t, b)
}

func TestSharedSlotsComeFromTheLease(t *testing.T) {
	b, _ := newShared(Spec{MaxConcurrent: 10})
	b.SetLease(at(0), "k", Lease{Slots: 1})
	admit1(t, at(0), b, "k", 0)
	if _, d := Admit(at(0), []Request{{Budget: b, Key: "k"}}, nil); d == nil || d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("second statement with one slot: got %+v, want a concurrency refusal", d)
	}
	if u := b.TakeUsage(at(0), nil); len(u) != 1 || u[0].Wanted != 2 || u[0].InFlight != 1 {
		t.Fatalf("usage = %+v, want wanted 2, 1 in flight", u)
	}
	b.SetLease(at(0), "k", Lease{Slots: 2})
	admit1(t, at(0), b, "k", 0)
}

func TestSharedEmptyBucketAdmitsAStatementLargerThanItsLease(t *testing.T) {
	b, _ := newShared(Spec{Rate: 1, Burst: 1})
	b.SetLease(at(0), "", Lease{Rate: 0.1, Burst: 0.1})
	charge(t, at(0), b, "", 0.5) // larger than the lease's bucket, within the budget's
	_, d := Admit(at(1), []Request{{Budget: b, Cost: 0.5}}, nil)
	if d == nil || d.RetryAfter != 4*time.Second {
		t.Fatalf("got %+v, want a refusal until the 0.4 left is gone at 0.1/s (4s)", d)
	}
	admit1(t, at(5), b, "", 0.5)
	if _, d := Admit(at(5), []Request{{Budget: b, Cost: 1.5}}, nil); d == nil || d.Reason != vocab.ReasonPerQuery {
		t.Fatalf("larger than the budget's burst: got %+v, want per_query_limit", d)
	}
}

func TestSetLeaseForgivesAtMostTheBurstLost(t *testing.T) {
	b, _ := newShared(Spec{Rate: 1, Burst: 1})
	b.SetLease(at(0), "", Lease{Rate: 1, Burst: 1})
	charge(t, at(0), b, "", 1)
	b.SetLease(at(0), "", Lease{Rate: 0.25, Burst: 0.25})
	if got := b.Snapshot(at(0)).Debt; got != 0.25 {
		t.Fatalf("debt after the lease shrank = %v, want 0.25 (capped)", got)
	}
	charge(t, at(1), b, "", 0.5) // drained to 0 at 0.25/s, then a large statement
	b.SetLease(at(1), "", Lease{Rate: 0.2, Burst: 0.2})
	if got := b.Snapshot(at(1)).Debt; got < 0.45-1e-9 || got > 0.45+1e-9 {
		t.Fatalf("debt = %v, want 0.45: only the 0.05 of burst lost is forgiven", got)
	}
}

func TestSetLeaseRaisesDebtToItsShareOfTheGlobalDebt(t *testing.T) {
	// Another instance used the whole burst and its lease shrank; this one's first lease
	// comes with its share of that debt: its bucket offers no room the global one lacks.
	b, _ := newShared(Spec{Rate: 1, Burst: 1})
	b.SetLease(at(0), "", Lease{Rate: 0.25, Burst: 0.25, Debt: 0.2})
	if got := b.Snapshot(at(0)).Debt; math.Abs(got-0.2) > 1e-9 {
		t.Fatalf("debt = %v, want the lease's share 0.2", got)
	}
	if _, d := Admit(at(0), []Request{{Budget: b, Cost: 0.1}}, nil); d == nil || d.Reason != vocab.ReasonBudget {
		t.Fatalf("0.1 over a debt of 0.2 in a bucket of 0.25: got %+v, want a budget refusal", d)
	}
	// A floor, not a charge: a larger local debt stays as it is.
	charge(t, at(0), b, "", 0.05)
	b.SetLease(at(0), "", Lease{Rate: 0.25, Burst: 0.25, Debt: 0.1})
	if got := b.Snapshot(at(0)).Debt; math.Abs(got-0.25) > 1e-9 {
		t.Fatalf("debt = %v, want 0.25 kept", got)
	}
	mustInvariants(t, b)
}

func TestSetLeaseWakesWaiters(t *testing.T) {
	b, _ := newShared(Spec{Rate: 1, Burst: 1, MaxQueue: 4})
	req := []Request{{Budget: b, Cost: 0.1}}
	_, d := Admit(at(0), req, nil)
	if d == nil {
		t.Fatal("admitted without a lease")
	}
	var w Waiter
	if Join(&w, req, d) != -1 {
		t.Fatal("could not join")
	}
	select {
	case <-w.Wake():
		t.Fatal("woken before any lease")
	default:
	}
	b.SetLease(at(0), "", Lease{Rate: 1, Burst: 1})
	select {
	case <-w.Wake():
	default:
		t.Fatal("SetLease did not wake the first waiter")
	}
	if _, d := Admit(at(0), req, nil); d != nil {
		t.Fatalf("the first waiter was refused under its new lease: %+v", d)
	}
	Leave(&w, req)
}

// TestZeroLeaseKeepsThePartition: a zero lease is the coordinator's word that the other
// instances hold the budget: the partition stays, refused, rather than starting over on the
// provisional lease.
func TestZeroLeaseKeepsThePartition(t *testing.T) {
	b, _ := newShared(Spec{MaxConcurrent: 4})
	b.SetProvisional(nil, Lease{Slots: 4})
	b.SetLease(at(0), "a", Lease{})
	if _, d := Admit(at(0), []Request{{Budget: b, Key: "a"}}, nil); d == nil || d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("a partition leased no slot: got %+v, want a concurrency refusal", d)
	}
	if got := b.Snapshot(at(0)).Keys; got != 1 {
		t.Fatalf("keys = %d, want the partition kept", got)
	}
	mustInvariants(t, b)
}

func TestDropLeaseForgetsAnIdlePartition(t *testing.T) {
	b, _ := newShared(Spec{Rate: 1, Burst: 1})
	b.SetProvisional(nil, Lease{Rate: 0.5, Burst: 0.1})
	b.SetLease(at(0), "a", Lease{Rate: 1, Burst: 1})
	b.SetLease(at(0), "b", Lease{Rate: 1, Burst: 1})
	b.SetLease(at(0), "c", Lease{Rate: 1, Burst: 1})
	admit1(t, at(0), b, "b", 0.1)
	charge(t, at(0), b, "c", 0.1)
	b.TakeUsage(at(0), nil) // reported: the coordinator leaves c and a after idle syncs
	b.DropLease(at(0), "a")
	b.DropLease(at(0), "b") // in flight: kept, on the provisional lease
	b.DropLease(at(0), "c") // debt left: kept, on the provisional lease
	if got := b.Snapshot(at(0)).Keys; got != 2 {
		t.Fatalf("keys = %d, want 2 (a dropped, b in flight, c in debt)", got)
	}
	u := b.TakeUsage(at(0), nil)
	if len(u) != 1 || u[0].Key != "b" || !u[0].Provisional {
		t.Fatalf("usage = %+v, want b on a provisional lease", u)
	}
	// c drains at the provisional rate, 0.5/s: the 0.1 left is gone after 200ms.
	if got := b.Snapshot(at(0.1)).MaxDebt; math.Abs(got-0.05) > 1e-9 {
		t.Fatalf("c's debt after 100ms = %v, want 0.05 (drained at the provisional rate)", got)
	}
	Release(at(0.2), &Request{Budget: b, Key: "b", Cost: 0.1}, 0.1)
	b.DropLease(at(0.4), "b")
	b.DropLease(at(0.4), "c")
	if got := b.Snapshot(at(0.4)).Keys; got != 0 {
		t.Fatalf("keys = %d, want none once idle and drained", got)
	}
	mustInvariants(t, b)
}

// TestProvisionalLeaseAdmitsANewPartition: a partition the coordinator has not leased runs on
// the provisional lease, with no refusal, and kicks the coordinator once per statement so that
// its own lease comes at an early sync; a lease of its own ends the kicks.
func TestProvisionalLeaseAdmitsANewPartition(t *testing.T) {
	b, kicks := newShared(Spec{Rate: 1, Burst: 1, MaxConcurrent: 8})
	b.SetProvisional(nil, Lease{Rate: 1, Burst: 0.1, Slots: 2})
	admit1(t, at(0), b, "t1", 0.05)
	admit1(t, at(0), b, "t1", 0.05)
	if *kicks != 2 {
		t.Fatalf("kicks = %d, want one per statement on the provisional lease", *kicks)
	}
	if _, d := Admit(at(0), []Request{{Budget: b, Key: "t1"}}, nil); d == nil || d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("a third statement on 2 provisional slots: got %+v, want a concurrency refusal", d)
	}
	// An absent partition is checked against it too.
	if d := Check(at(0), []Request{{Budget: b, Key: "t2", Cost: 0.5}}); d != nil {
		t.Fatalf("an absent partition with no debt: got %+v, want admitted on the provisional rate", d)
	}
	u := b.TakeUsage(at(0), nil)
	if len(u) != 1 || u[0].Key != "t1" || !u[0].Provisional || u[0].InFlight != 2 {
		t.Fatalf("usage = %+v, want t1 provisional, 2 in flight", u)
	}
	b.SetLease(at(0), "t1", Lease{Rate: 1, Burst: 1, Slots: 4})
	*kicks = 0
	admit1(t, at(0), b, "t1", 0.05)
	if *kicks != 0 {
		t.Fatalf("kicks = %d on a leased partition, want 0", *kicks)
	}
	for range 2 { // and still leased once its counters were reset
		if u := b.TakeUsage(at(0), nil); len(u) != 1 || u[0].Provisional {
			t.Fatalf("usage = %+v, want t1 leased", u)
		}
	}
	// A later provisional lease applies to the partitions met from then on.
	b.SetProvisional(nil, Lease{Rate: 1, Slots: 1})
	admit1(t, at(0), b, "t3", 0)
	if _, d := Admit(at(0), []Request{{Budget: b, Key: "t3"}}, nil); d == nil {
		t.Fatal("a second statement on one provisional slot was admitted")
	}
	mustInvariants(t, b)
}

// TestSetSharedKeepsOwnLimitsUntilLeased: a running budget that becomes shared (a reload that
// adds coordination) keeps enforcing its own limits on the partitions it holds until their
// leases arrive, while a partition it meets later starts on the provisional lease.
func TestSetSharedKeepsOwnLimitsUntilLeased(t *testing.T) {
	b := New(Spec{MaxConcurrent: 8})
	for range 6 {
		admit1(t, at(0), b, "", 0)
	}
	b.SetProvisional(b, Lease{Slots: 1})
	b.SetShared(at(0), b, func() {}, time.Second)
	admit1(t, at(0), b, "", 0)
	admit1(t, at(0), b, "", 0)
	if _, d := Admit(at(0), []Request{{Budget: b}}, nil); d == nil || d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("a ninth statement: got %+v, want refused at the budget's own 8", d)
	}
	if u := b.TakeUsage(at(0), nil); len(u) != 1 || !u[0].Provisional || u[0].InFlight != 8 {
		t.Fatalf("usage = %+v, want the partition on its own limits, 8 in flight", u)
	}
	b.SetLease(at(0), "", Lease{Slots: 8})
	if u := b.TakeUsage(at(0), nil); len(u) != 1 || u[0].Provisional {
		t.Fatalf("usage = %+v, want the partition leased", u)
	}
	mustInvariants(t, b)
}

// TestSetProvisionalOwner: a registration that no longer shares the budget (a coordinator
// replaced at a reload, whose loop has not stopped yet) cannot set its provisional lease.
func TestSetProvisionalOwner(t *testing.T) {
	b := New(Spec{MaxConcurrent: 4})
	first, second := new(int), new(int)
	b.SetShared(t0, first, func() {}, time.Second)
	b.SetShared(t0, second, func() {}, time.Second)
	b.SetProvisional(second, Lease{Slots: 2})
	b.SetProvisional(first, Lease{Slots: 4})
	admit1(t, at(0), b, "k", 0)
	admit1(t, at(0), b, "k", 0)
	if _, d := Admit(at(0), []Request{{Budget: b, Key: "k"}}, nil); d == nil {
		t.Fatal("the replaced registration's provisional lease applies")
	}
}

func TestSetSharedNilMakesTheBudgetLocal(t *testing.T) {
	b, _ := newShared(Spec{Rate: 1, Burst: 1, MaxConcurrent: 1})
	b.SetLease(at(0), "", Lease{Rate: 0.5, Burst: 0.5, Slots: 1})
	charge(t, at(0), b, "", 0.5)
	b.SetShared(at(0), nil, nil, 0)
	admit1(t, at(0), b, "", 0.5) // the spec's burst of 1 again
	if u := b.TakeUsage(at(0), nil); len(u) != 0 {
		t.Errorf("a local budget reports usage %+v", u)
	}
	mustInvariants(t, b)
}

// TestSetSharedOwner: a budget shared by a second registration (a coordinator that replaced
// the first at a reload) stays shared when the first one ends, and goes local when its owner
// ends.
func TestSetSharedOwner(t *testing.T) {
	b := New(Spec{MaxConcurrent: 4})
	first, second := new(int), new(int)
	b.SetShared(t0, first, func() {}, time.Second)
	b.SetShared(t0, second, func() {}, time.Second)
	b.SetShared(t0, first, nil, 0) // the replaced coordinator closes
	b.mu.Lock()
	shared := b.keys.shared
	b.mu.Unlock()
	if !shared {
		t.Fatal("the replaced registration's end made the budget local under its new owner")
	}
	b.SetShared(t0, second, nil, 0)
	b.mu.Lock()
	shared = b.keys.shared
	b.mu.Unlock()
	if shared {
		t.Fatal("the owner's end left the budget shared")
	}
}
