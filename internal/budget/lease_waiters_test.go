package budget

import (
	"testing"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// TestTakeUsageCountsWaitersAtEveryReport: statements waiting (max_wait) for a partition's
// slot want one each at every report while they wait, not only at the report after they were
// refused: a report that forgot them would tell the coordinator that the partition wants
// nothing, and it would hand their slots to other instances, or leave the partition.
func TestTakeUsageCountsWaitersAtEveryReport(t *testing.T) {
	b, _ := newShared(Spec{MaxConcurrent: 2, MaxQueue: 4})
	b.SetLease(at(0), "t", Lease{}) // the other instances hold the tenant's slots
	reqs := make([][]Request, 2)
	ws := make([]Waiter, 2)
	for i := range reqs {
		reqs[i] = []Request{{Budget: b, Key: "t"}}
		_, d := Admit(at(0), reqs[i], nil)
		if d == nil || d.Reason != vocab.ReasonConcurrency {
			t.Fatalf("statement %d on a lease of no slot: got %+v, want a concurrency refusal", i, d)
		}
		if Join(&ws[i], reqs[i], d) != -1 {
			t.Fatalf("statement %d could not wait", i)
		}
	}
	for report := range 3 {
		u := b.TakeUsage(at(float64(report)), nil)
		if len(u) != 1 || u[0].Key != "t" || u[0].Wanted != 2 || u[0].Waiting != 2 || !u[0].Starved {
			t.Fatalf("report %d with two statements waiting: %+v, want t wanted 2, waiting 2, starved", report, u)
		}
	}
	// Wanted is the peak since the previous report: two until a whole report has seen one.
	Leave(&ws[0], reqs[0])
	if u := b.TakeUsage(at(3), nil); len(u) != 1 || u[0].Wanted != 2 || u[0].Waiting != 1 {
		t.Fatalf("one waiter left since the last report: %+v, want t wanted 2 (the peak), waiting 1", u)
	}
	if u := b.TakeUsage(at(4), nil); len(u) != 1 || u[0].Wanted != 1 || u[0].Waiting != 1 {
		t.Fatalf("one waiter since the last report: %+v, want t wanted 1, waiting 1", u)
	}
	Leave(&ws[1], reqs[1])
	b.TakeUsage(at(5), nil)
	if u := b.TakeUsage(at(6), nil); len(u) != 0 {
		t.Fatalf("no waiter since the last report: %+v, want nothing to report", u)
	}
	mustInvariants(t, b)
}

// TestDropLeaseKeepsAndWakesWaiters: a partition the coordinator leaves while statements wait
// for it is kept, on the provisional lease, and its first waiter is woken to be decided again
// under it, where it fits.
func TestDropLeaseKeepsAndWakesWaiters(t *testing.T) {
	b, _ := newShared(Spec{MaxConcurrent: 2, MaxQueue: 4})
	b.SetProvisional(nil, Lease{Slots: 1})
	b.SetLease(at(0), "t", Lease{})
	req := []Request{{Budget: b, Key: "t"}}
	_, d := Admit(at(0), req, nil)
	if d == nil {
		t.Fatal("admitted on a lease of no slot")
	}
	var w Waiter
	if Join(&w, req, d) != -1 {
		t.Fatal("could not wait")
	}
	b.DropLease(at(1), "t")
	select {
	case <-w.Wake():
	default:
		t.Fatal("DropLease did not wake the waiter: it would sleep until its max_wait on a lease that has room")
	}
	if got := b.Snapshot(at(1)).Keys; got != 1 {
		t.Fatalf("keys = %d, want the partition its statement waits for kept", got)
	}
	if _, d := Admit(at(1), req, nil); d != nil {
		t.Fatalf("the waiter on the provisional lease of one slot: %+v, want admitted", d)
	}
	Leave(&w, req)
	Release(at(2), &req[0], 0)
	mustInvariants(t, b)
}

// TestTakeUsageReportsTheWaitersOfAnEvictedKey: a key the table evicted (idle, nothing in flight)
// while a statement waits for it is reported all the same.
func TestTakeUsageReportsTheWaitersOfAnEvictedKey(t *testing.T) {
	b, _ := newShared(Spec{MaxConcurrent: 2, MaxQueue: 4, MaxKeys: 1})
	b.SetLease(at(0), "t", Lease{})
	req := []Request{{Budget: b, Key: "t"}}
	_, d := Admit(at(0), req, nil)
	if d == nil {
		t.Fatal("admitted on a lease of no slot")
	}
	var w Waiter
	if Join(&w, req, d) != -1 {
		t.Fatal("could not wait")
	}
	b.TakeUsage(at(0), nil)
	b.SetLease(at(0), "u", Lease{}) // evicts t, idle
	u := b.TakeUsage(at(1), nil)
	found := false
	for _, x := range u {
		found = found || x.Key == "t" && x.Waiting == 1 && x.Wanted == 1
	}
	if !found {
		t.Fatalf("usage = %+v, want t reported with its waiter", u)
	}
	Leave(&w, req)
	mustInvariants(t, b)
}
