package coord

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/budget"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

const sec = time.Second

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func TestEstimator(t *testing.T) {
	var e estimator
	if got := e.add(4, sec, sec); got != 4 {
		t.Fatalf("a rise is taken at once: got %v, want 4", got)
	}
	if got := e.add(0, sec, sec); !near(got, 2) {
		t.Fatalf("a fall halves the gap per half-life: got %v, want 2", got)
	}
	if got := e.add(0, 2*sec, sec); !near(got, 0.5) {
		t.Fatalf("two half-lives quarter it: got %v, want 0.5", got)
	}
	if got := e.add(3, sec/10, sec); got != 3 {
		t.Fatalf("a rise after a fall is taken at once: got %v, want 3", got)
	}
}

func TestFallbackLease(t *testing.T) {
	for _, tc := range []struct {
		name      string
		spec      Spec
		instances int
		want      budget.Lease
	}{
		{"even share", Spec{Rate: 2, Burst: 4, MaxConcurrent: 8}, 4, budget.Lease{Rate: 0.5, Burst: 1, Slots: 2}},
		{"slots round down", Spec{Rate: 1, Burst: 1, MaxConcurrent: 7}, 2, budget.Lease{Rate: 0.5, Burst: 0.5, Slots: 3}},
		{"at least one slot", Spec{MaxConcurrent: 4}, 8, budget.Lease{Slots: 1}},
		{"no max_concurrent", Spec{Rate: 1, Burst: 1}, 2, budget.Lease{Rate: 0.5, Burst: 0.5}},
		{"no instance counts as one", Spec{Rate: 1, Burst: 2, MaxConcurrent: 3}, 0, budget.Lease{Rate: 1, Burst: 2, Slots: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fallbackLease(tc.spec, tc.instances); got != tc.want {
				t.Fatalf("fallbackLease(%+v, %d) = %+v, want %+v", tc.spec, tc.instances, got, tc.want)
			}
		})
	}
}

func TestDecay(t *testing.T) {
	from, target := budget.Lease{Rate: 3, Burst: 6, Slots: 5}, budget.Lease{Rate: 1, Burst: 2, Slots: 1}
	if got := decay(from, target, t0, t0, sec); got != from {
		t.Fatalf("at the start: %+v, want %+v", got, from)
	}
	if got := decay(from, target, t0, t0.Add(sec), sec); !near(got.Rate, 2) || !near(got.Burst, 4) || got.Slots != 3 {
		t.Fatalf("after one half-life: %+v, want halfway", got)
	}
	if got := decay(from, target, t0, t0.Add(20*sec), sec); got != target {
		t.Fatalf("long after: %+v, want %+v", got, target)
	}
	// Instances that lost Redis together converge on the same share: the sum of their
	// rates, within the budget when they lost it, stays within it all the way.
	leases := []budget.Lease{{Rate: 0.7}, {Rate: 0.2}, {Rate: 0.1}, {Rate: 0}}
	fb := budget.Lease{Rate: 0.25}
	for d := time.Duration(0); d < 10*sec; d += 100 * time.Millisecond {
		sum := 0.0
		for _, l := range leases {
			sum += decay(l, fb, t0, t0.Add(d), sec).Rate
		}
		if sum > 1+1e-9 {
			t.Fatalf("at %v the decaying rates sum to %v > 1", d, sum)
		}
	}
}

// newTestCore is a core with a fixed jitter of 0.5 (regular syncs exactly one interval
// apart, retries exactly one interval after a failure).
func newTestCore(spec Spec) *core {
	return newCore(spec, sec, 10, func() float64 { return 0.5 })
}

func grantAll(c *core, sent time.Time, res func(key string) result) {
	for _, reps := range c.reports(sent) {
		out := make([]result, len(reps))
		for i, r := range reps {
			out[i] = res(r.p.key)
		}
		c.applied(sent, sent.Add(time.Millisecond), reps, out)
	}
}

// grantTwice is grantAll an interval before now and at now: a lease whose burst is not
// capped as a partition's first interval's are.
func grantTwice(c *core, now time.Time, res func(key string) result) {
	grantAll(c, now.Add(-c.interval), res)
	grantAll(c, now, res)
}

func TestFirstLeaseHasTheBurstOfTheAssumedInstances(t *testing.T) {
	c := newTestCore(Spec{Name: "b", Rate: 1, Burst: 2})
	c.absorb(t0, []budget.Usage{{Key: "", Offered: 1, Starved: true}})
	alone := func(string) result {
		return result{lease: budget.Lease{Rate: 1, Burst: 2}, debt: 1, hold: 1, target: 1, live: 1}
	}
	grantAll(c, t0, alone)
	// Alone in the partition it is granted the whole burst, but others may be starting.
	first := c.lease(c.parts[""], t0.Add(time.Millisecond))
	if want := (budget.Lease{Rate: 1, Burst: 0.2, Debt: 0.2}); first != want {
		t.Fatalf("first lease %+v, want %+v: the burst over the %d instances assumed, its debt within it",
			first, want, c.fallbackN)
	}
	grantAll(c, t0.Add(sec/4), alone)
	if got := c.lease(c.parts[""], t0.Add(sec/4+time.Millisecond)); got.Burst != 0.2 {
		t.Fatalf("an early second lease %+v, want the burst still capped for the first interval", got)
	}
	grantAll(c, t0.Add(sec), alone)
	if got := c.lease(c.parts[""], t0.Add(sec+time.Millisecond)); got.Burst != 2 {
		t.Fatalf("a lease an interval after the first %+v, want the burst granted", got)
	}
}

func TestLeaseLifecycle(t *testing.T) {
	spec := Spec{Name: "b", Rate: 4, Burst: 8, MaxConcurrent: 8}
	c := newTestCore(spec)
	c.absorb(t0, []budget.Usage{{Key: "k", Offered: 1}})
	p := c.parts["k"]
	// Before any sync answered: the budget over the 10 instances assumed, no burst.
	if got, want := c.lease(p, t0), (budget.Lease{Rate: 0.4, Slots: 1}); got != want {
		t.Fatalf("before the first sync: %+v, want the provisional lease %+v", got, want)
	}
	grant := budget.Lease{Rate: 1, Burst: 2, Slots: 2}
	grantTwice(c, t0, func(string) result { return result{lease: grant, live: 4} })
	for _, d := range []time.Duration{0, sec, leaseDuration(sec) - 1} {
		if got := c.lease(p, t0.Add(d)); got != grant {
			t.Fatalf("at %v, within the lease: %+v, want %+v", d, got, grant)
		}
	}
	// Lapsed: decays towards the budget over the 4 known instances.
	fb := budget.Lease{Rate: 1, Burst: 2, Slots: 2}
	if got := c.lease(p, t0.Add(20*sec)); got != fb {
		t.Fatalf("long after the lease lapsed: %+v, want %+v", got, fb)
	}
}

// TestProvisionalLease: a partition with no grant runs on what Redis would grant it were no
// instance asking for any of it: the budget over the instances last seen sharing it (the most
// in one partition, at the last regular sync), the burst of a first interval, none before any
// sync answered or while syncs fail.
func TestProvisionalLease(t *testing.T) {
	spec := Spec{Name: "b", Rate: 4, Burst: 8, MaxConcurrent: 64}
	c := newTestCore(spec)
	if got, want := c.provisional(), (budget.Lease{Rate: 0.4, Slots: 6}); got != want {
		t.Fatalf("before any sync: %+v, want %+v (the 10 instances assumed, no burst)", got, want)
	}
	c.keepUnkeyed(t0)
	c.absorb(t0, []budget.Usage{{Key: "t1", Offered: 1}})
	live := map[string]int{"": 3, "t1": 1}
	grantAll(c, t0, func(key string) result { return result{live: live[key]} })
	if got, want := c.provisional(), (budget.Lease{Rate: 4.0 / 3, Burst: 0.8, Slots: 21}); !near(got.Rate, want.Rate) ||
		got.Burst != want.Burst || got.Slots != want.Slots {
		t.Fatalf("three instances seen: %+v, want %+v (a third, the burst of a first interval)", got, want)
	}
	// Alone: the whole budget's slots and rate.
	live[""] = 1
	grantAll(c, t0.Add(sec), func(key string) result { return result{live: live[key]} })
	grantAll(c, t0.Add(2*sec), func(key string) result { return result{live: live[key]} })
	if got, want := c.provisional(), (budget.Lease{Rate: 4, Burst: 0.8, Slots: 64}); got != want {
		t.Fatalf("alone: %+v, want %+v", got, want)
	}
	// A partition met now has it, and it is not handed over: the local budget holds it to it.
	c.absorb(t0.Add(2*sec), []budget.Usage{{Key: "t2", Offered: 1, Provisional: true}})
	if got := c.lease(c.parts["t2"], t0.Add(2*sec)); got != c.provisional() {
		t.Fatalf("a new partition's lease %+v, want the provisional %+v", got, c.provisional())
	}
	for _, p := range c.pushes(t0.Add(2 * sec)) {
		if p.key == "t2" {
			t.Fatalf("the provisional lease was handed over: %+v", p)
		}
	}
	// Its first report says the local budget holds it to the provisional slots.
	for _, reps := range c.earlyReports(t0.Add(2*sec + sec/10)) {
		for _, r := range reps {
			if r.p.key == "t2" && r.applied != 64 {
				t.Fatalf("the first report applies %d slots, want the provisional 64", r.applied)
			}
		}
	}
	c.failed(t0.Add(3*sec), t0.Add(3*sec))
	if got := c.provisional(); got.Burst != 0 || got.Slots != 64 {
		t.Fatalf("while syncs fail: %+v, want no burst", got)
	}
	if ps := c.pushes(t0.Add(3 * sec)); !slices.ContainsFunc(ps, func(p push) bool { return p.key == "t2" }) {
		t.Fatalf("while syncs fail, a partition with no grant is handed its lease: %+v", ps)
	}
}

// TestLeaseHandedOverAgainToABudgetThatLostIt: a local budget that evicted a partition (its
// table full) meets it again on the provisional lease; the partition's grant is handed over
// again at once, not only when it changes.
func TestLeaseHandedOverAgainToABudgetThatLostIt(t *testing.T) {
	c := newTestCore(Spec{Name: "b", MaxConcurrent: 8})
	c.absorb(t0, []budget.Usage{{Key: "k", Wanted: 1}})
	grant := budget.Lease{Slots: 2}
	grantAll(c, t0, func(string) result { return result{lease: grant, live: 4} })
	if ps := c.pushes(t0); len(ps) != 1 || ps[0].lease != grant {
		t.Fatalf("pushes %+v, want the grant", ps)
	}
	if ps := c.pushes(t0); len(ps) != 0 {
		t.Fatalf("pushes %+v, want none: nothing changed", ps)
	}
	c.absorb(t0, []budget.Usage{{Key: "k", Wanted: 1, Provisional: true}})
	if ps := c.pushes(t0); len(ps) != 1 || ps[0].lease != grant {
		t.Fatalf("pushes %+v after the budget lost the lease, want the grant again", ps)
	}
}

func TestDecayAfterLapse(t *testing.T) {
	c := newTestCore(Spec{Name: "b", Rate: 4, Burst: 4, MaxConcurrent: 8})
	c.absorb(t0, []budget.Usage{{Key: "", Offered: 10}})
	grantTwice(c, t0, func(string) result { return result{lease: budget.Lease{Rate: 3, Burst: 3, Slots: 6}, live: 2} })
	p := c.parts[""]
	lapse := t0.Add(leaseDuration(sec))
	// Redis stops counting a lapsed grant: a larger one drops to the even share at once.
	if got, want := c.lease(p, lapse), (budget.Lease{Rate: 2, Burst: 2, Slots: 4}); got != want {
		t.Fatalf("at the lapse: %+v, want the budget over the 2 instances %+v", got, want)
	}

	// A smaller one rises towards it, halfway per interval.
	c = newTestCore(Spec{Name: "b", Rate: 4, Burst: 4, MaxConcurrent: 8})
	c.absorb(t0, []budget.Usage{{Key: "", Offered: 10}})
	grantTwice(c, t0, func(string) result { return result{lease: budget.Lease{Rate: 1, Burst: 1, Slots: 2}, live: 2} })
	got := c.lease(c.parts[""], lapse.Add(sec))
	if !near(got.Rate, 1.5) || !near(got.Burst, 1.5) || got.Slots != 3 {
		t.Fatalf("one interval after the lapse: %+v, want halfway up to the even share", got)
	}
}

func TestFallbackBeforeAnySync(t *testing.T) {
	c := newTestCore(Spec{Name: "b", Rate: 10, Burst: 10, MaxConcurrent: 20})
	c.absorb(t0, []budget.Usage{{Key: "k", Offered: 1}})
	c.reports(t0)
	c.failed(t0, t0.Add(time.Millisecond))
	got := c.lease(c.parts["k"], t0.Add(time.Millisecond))
	// DefaultFallbackInstances-like guess of 10, with no burst room: any number of instances
	// may be starting beside it, each with a fresh bucket.
	want := budget.Lease{Rate: 1, Burst: 0, Slots: 2}
	if got != want {
		t.Fatalf("Redis never reached: %+v, want the budget over the assumed 10 instances, no burst, %+v", got, want)
	}
}

func TestLeaseCarriesTheDebtToHold(t *testing.T) {
	c := newTestCore(Spec{Name: "b", Rate: 1, Burst: 1})
	c.absorb(t0, []budget.Usage{{Key: "", Offered: 1, Starved: true, Debt: 0.1}})
	grantTwice(c, t0, func(string) result {
		return result{lease: budget.Lease{Rate: 0.25, Burst: 0.25}, debt: 0.8, hold: 0.2, target: 0.25, live: 4}
	})
	if got := c.lease(c.parts[""], t0.Add(time.Millisecond)); !near(got.Debt, 0.2) {
		t.Fatalf("lease %+v: want debt 0.2, what Redis said to hold", got)
	}
	// More than the burst fills the bucket, no more.
	grantAll(c, t0.Add(sec), func(string) result {
		return result{lease: budget.Lease{Rate: 0.25, Burst: 0.25}, debt: 3, hold: 3, target: 0.25, live: 4}
	})
	if got := c.lease(c.parts[""], t0.Add(sec+time.Millisecond)); !near(got.Debt, 0.25) {
		t.Fatalf("lease %+v: want debt 0.25, the lease's burst", got)
	}
}

func TestReportSaysWhatTheBucketHolds(t *testing.T) {
	c := newTestCore(Spec{Name: "b", Rate: 1, Burst: 1})
	c.absorb(t0, []budget.Usage{{Key: "", Offered: 1, Debt: 0.3}})
	if r := c.reports(t0)[0][0]; !near(r.held, 0.3) {
		t.Fatalf("report held %v, want the 0.3 the bucket holds", r.held)
	}
	c.applied(t0, t0, c.reports(t0)[0], []result{{lease: budget.Lease{Rate: 0.25, Burst: 0.25}, live: 4}})
	c.pushes(t0)
	// Not in the next usage (idle): drained at the lease's rate since.
	c.absorb(t0.Add(sec), nil)
	if r := c.reports(t0.Add(sec))[0][0]; !near(r.held, 0.05) {
		t.Fatalf("a second later at 0.25/s: held %v, want 0.05", r.held)
	}
}

func TestStarvedPartitionSyncsWhenAnotherLeaseLapses(t *testing.T) {
	c := newTestCore(Spec{Name: "b", MaxConcurrent: 4})
	c.absorb(t0, []budget.Usage{{Key: "", Wanted: 4, Starved: true}})
	// Redis answers at t0+1ms: another instance's lease lapses 300ms later.
	grantAll(c, t0, func(string) result {
		return result{lease: budget.Lease{Slots: 1}, targetSlots: 1, live: 4, retake: 300 * time.Millisecond}
	})
	lapse := t0.Add(301 * time.Millisecond)
	if w := c.nextWake(t0.Add(10 * time.Millisecond)); !w.Equal(lapse) {
		t.Fatalf("the loop must look again when the lease lapses: at %v, want %v", w.Sub(t0), lapse.Sub(t0))
	}
	if c.due(lapse.Add(-1), false) {
		t.Fatal("due before the other lease lapsed")
	}
	if !c.due(lapse, false) {
		t.Fatal("a starved partition must sync when another lease lapses, without waiting for a kick")
	}
	// The sync at the lapse gets the slots; no second early sync follows.
	grantAll(c, lapse, func(string) result { return result{lease: budget.Lease{Slots: 2}, targetSlots: 2, live: 3} })
	if c.due(lapse.Add(500*time.Millisecond), false) {
		t.Fatal("an answer without retake must clear it")
	}
	// While Redis fails, retries keep their jittered schedule.
	grantAll(c, lapse.Add(sec), func(string) result {
		return result{lease: budget.Lease{Slots: 1}, targetSlots: 2, live: 3, retake: 100 * time.Millisecond}
	})
	c.reports(lapse.Add(1050 * time.Millisecond))
	c.failed(lapse.Add(1050*time.Millisecond), lapse.Add(1060*time.Millisecond))
	if c.due(lapse.Add(1200*time.Millisecond), false) {
		t.Fatal("a failing budget must not sync early for a lapsed lease")
	}
}

// TestWantedHolderSyncsEarly: a message that another instance wants slots this one holds makes
// the partition sync early, an eighth of an interval after the last sync at the soonest,
// whatever the messages; a message about a partition it holds no slots of changes nothing.
func TestWantedHolderSyncsEarly(t *testing.T) {
	c := newTestCore(Spec{Name: "b", MaxConcurrent: 8})
	c.absorb(t0, []budget.Usage{{Key: "k", Wanted: 1}})
	grantAll(c, t0, func(string) result { return result{lease: budget.Lease{Slots: 4}, targetSlots: 4, live: 2} })
	if c.wanted(t0, "other") || c.wanted(t0, "") {
		t.Fatal("marked a partition this instance does not hold")
	}
	at := t0.Add(10 * time.Millisecond)
	for range 2 { // a second message changes nothing
		if !c.wanted(at, "k") {
			t.Fatal("the held partition was not marked")
		}
	}
	soonest := c.last.Add(shortGap(c.interval))
	if c.due(soonest.Add(-1), false) {
		t.Fatal("due sooner than an eighth of an interval after the last sync")
	}
	if !c.due(soonest, false) {
		t.Fatal("a wanted holder must sync early without a kick")
	}
	chunks := c.earlyReports(soonest)
	if len(chunks) != 1 || len(chunks[0]) != 1 || chunks[0][0].p.key != "k" {
		t.Fatalf("the early sync carries %v, want the wanted partition", chunks)
	}
	grantAll(c, soonest, func(string) result { return result{lease: budget.Lease{Slots: 1}, targetSlots: 1, live: 2} })
	if c.due(soonest.Add(500*time.Millisecond), false) {
		t.Fatal("an answer must clear the mark")
	}
}

// TestWantedHolderEstimateFallsFast: a holder told that another instance wants slots it holds
// reports, at its next sync, an estimate of a demand that stopped (48 slots, then 2) fallen
// eight times as fast as without the message (its half-life an eighth of an interval); its
// later syncs fall slowly again from there, and without a message the estimate falls slowly
// as before.
func TestWantedHolderEstimateFallsFast(t *testing.T) {
	for _, called := range []bool{true, false} {
		t.Run(fmt.Sprintf("called=%v", called), func(t *testing.T) {
			c := newTestCore(Spec{Name: "b", MaxConcurrent: 64})
			c.absorb(t0, []budget.Usage{{Key: "k", Wanted: 48, InFlight: 48}})
			grantAll(c, t0, func(string) result { return result{lease: budget.Lease{Slots: 56}, targetSlots: 56, live: 2} })
			at := t0.Add(200 * time.Millisecond)
			c.absorb(at, []budget.Usage{{Key: "k", Wanted: 2, InFlight: 2}})
			if called && !c.wanted(at, "k") {
				t.Fatal("the held partition was not marked")
			}
			var reps [][]report
			if called {
				reps = c.earlyReports(at)
			} else {
				reps = c.reports(at)
			}
			if len(reps) != 1 || len(reps[0]) != 1 {
				t.Fatalf("the sync carries %v, want the partition", reps)
			}
			got, want := reps[0][0].want, 17 // 2 + 46 × 2^−1.6, rounded: the fast fall
			if !called {
				want = 42 // 2 + 46 × 2^−0.2, rounded: the slow fall
			}
			if got != want {
				t.Fatalf("reported %d slots wanted, want %d", got, want)
			}
			c.applied(at, at.Add(time.Millisecond), reps[0], []result{{lease: budget.Lease{Slots: 30}, targetSlots: 30, live: 2}})
			// Idle for an interval: the estimate falls slowly from what was reported.
			later := at.Add(sec)
			reps = c.reports(later)
			if got, want := reps[0][0].want, (want+1)/2; got != want {
				t.Fatalf("an interval later: reported %d slots wanted, want %d (half of the last report)", got, want)
			}
		})
	}
}

func TestDue(t *testing.T) {
	c := newTestCore(Spec{Name: "b", Rate: 1, Burst: 1, MaxConcurrent: 4})
	if !c.due(t0, false) {
		t.Fatal("a new budget is due at once")
	}
	c.absorb(t0, []budget.Usage{{Key: "a", Offered: 1}})
	grantAll(c, t0, func(string) result {
		return result{lease: budget.Lease{Rate: 0.5, Burst: 0.5, Slots: 2}, target: 0.5, targetSlots: 2, live: 2}
	})
	if c.due(t0.Add(sec/2-1), false) || !c.due(t0.Add(sec/2), false) {
		t.Fatal("the first regular sync draws the phase of the next: rand (0.5) × an interval after it")
	}

	// A new partition asks for an early sync after a tenth of an interval.
	c.absorb(t0.Add(50*time.Millisecond), []budget.Usage{{Key: "new", Offered: 1, Starved: true}})
	if c.due(t0.Add(100*time.Millisecond), false) {
		t.Fatal("without a kick nothing is early")
	}
	if c.due(t0.Add(50*time.Millisecond), true) {
		t.Fatal("an early sync needs a tenth of an interval since the last")
	}
	if w := c.nextWake(t0.Add(50 * time.Millisecond)); !w.Equal(t0.Add(100 * time.Millisecond)) {
		t.Fatalf("the loop must look again when the early sync may come: %v", w.Sub(t0))
	}
	if !c.due(t0.Add(100*time.Millisecond), false) {
		t.Fatal("a kick is remembered until the sync: due a tenth of an interval after the last")
	}
	grantAll(c, t0.Add(100*time.Millisecond), func(string) result {
		return result{lease: budget.Lease{Rate: 0.1, Burst: 0.1, Slots: 1}, target: 0.5, targetSlots: 2, live: 2}
	})

	// Starved below the fair share: early after an eighth of an interval.
	at := t0.Add(150 * time.Millisecond)
	c.absorb(at, []budget.Usage{{Key: "new", Offered: 5, Starved: true}})
	if c.due(at.Add(50*time.Millisecond), true) {
		t.Fatal("a starved partition waits an eighth of an interval")
	}
	if !c.due(t0.Add(225*time.Millisecond), true) {
		t.Fatal("a starved partition below its fair share syncs an eighth of an interval after the last")
	}

	// Starved at its fair share: nothing to gain, no early sync.
	grantAll(c, t0.Add(350*time.Millisecond), func(string) result {
		return result{lease: budget.Lease{Rate: 0.5, Burst: 0.5, Slots: 2}, target: 0.5, targetSlots: 2, live: 2}
	})
	c.absorb(t0.Add(400*time.Millisecond), []budget.Usage{{Key: "new", Offered: 5, Starved: true}})
	if c.due(t0.Add(900*time.Millisecond), true) {
		t.Fatal("a partition starved at its fair share does not sync early")
	}

	// Starved wanting more slots at once than its last sync reported (a burst), with fewer
	// than max_concurrent: Redis may have room for it, so it syncs an eighth of an interval
	// after the last.
	c.absorb(t0.Add(950*time.Millisecond), []budget.Usage{{Key: "new", Offered: 5, Wanted: 4, Starved: true}})
	if !c.due(t0.Add(950*time.Millisecond), true) {
		t.Fatal("a starved partition wanting more slots than it reported syncs early")
	}
}

// TestRegularSyncsKeepTheirGrid: the first regular sync draws the instance's phase, and each
// regular sync after it is due an interval after the last was due, however late that one
// began, so that a partition is renewed every interval. A sync that takes longer than an
// interval is followed at once by the next; one that began more than an interval late
// starts the grid again from its start.
func TestRegularSyncsKeepTheirGrid(t *testing.T) {
	c := newCore(Spec{Name: "b", MaxConcurrent: 4}, sec, 10, func() float64 { return 0.25 })
	lease := []result{{lease: budget.Lease{Slots: 1}, targetSlots: 1, live: 1}}
	sync := func(begun, answered time.Time) {
		c.absorb(begun, []budget.Usage{{Key: "", Wanted: 1}})
		for _, reps := range c.reports(begun) {
			c.applied(begun, answered, reps, lease)
		}
	}
	dueAt := func(at time.Time, what string) {
		t.Helper()
		if c.due(at.Add(-1), false) || !c.due(at, false) {
			t.Fatalf("%s: want the next regular sync due at %v", what, at.Sub(t0))
		}
	}
	ms := time.Millisecond
	sync(t0, t0.Add(ms))
	dueAt(t0.Add(sec/4), "the phase drawn at the first regular sync (rand 0.25)")
	sync(t0.Add(sec/4+80*ms), t0.Add(sec/4+90*ms))
	dueAt(t0.Add(5*sec/4), "begun 80ms late: an interval after it was due, not after it began")
	sync(t0.Add(5*sec/4), t0.Add(2*sec+400*ms))
	dueAt(t0.Add(9*sec/4), "a sync longer than an interval: the next due before it ended")
	sync(t0.Add(2*sec+400*ms), t0.Add(2*sec+500*ms))
	dueAt(t0.Add(13*sec/4), "begun less than an interval late: on the grid")
	sync(t0.Add(4*sec+500*ms), t0.Add(4*sec+600*ms))
	dueAt(t0.Add(4*sec+500*ms), "begun more than an interval late: the grid starts again from its start")
	sync(t0.Add(4*sec+600*ms), t0.Add(4*sec+700*ms))
	dueAt(t0.Add(5*sec+500*ms), "on the new grid")
}

func TestFailureRetryIsJitteredAndNotEarly(t *testing.T) {
	for _, j := range []float64{0, 0.5, 0.999} {
		c := newCore(Spec{Name: "b", Rate: 1}, sec, 10, func() float64 { return j })
		c.absorb(t0, []budget.Usage{{Key: "", Offered: 1, Starved: true}})
		c.reports(t0)
		c.failed(t0, t0.Add(10*time.Millisecond))
		wait := time.Duration(float64(sec) * (0.5 + j))
		if c.due(t0.Add(wait-1), true) {
			t.Fatalf("jitter %v: a failing budget synced early", j)
		}
		if !c.due(t0.Add(wait), false) {
			t.Fatalf("jitter %v: the retry is not due after %v", j, wait)
		}
	}
}

func TestFailureRetryRenewsBeforeTheLeaseLapses(t *testing.T) {
	c := newCore(Spec{Name: "b", MaxConcurrent: 4}, sec, 10, func() float64 { return 0.999 })
	c.absorb(t0, []budget.Usage{{Key: "", Wanted: 1}})
	grantAll(c, t0, func(string) result { return result{lease: budget.Lease{Slots: 1}, targetSlots: 1, live: 2} })
	// The lease lapses at t0 + 2.5s; the regular sync at about t0 + 1.1s fails, and its
	// jittered retry (up to 1.5 intervals later) would come after the lapse.
	at := t0.Add(1100 * time.Millisecond)
	c.absorb(at, []budget.Usage{{Key: "", Wanted: 1}})
	c.reports(at)
	c.failed(at, at.Add(250*time.Millisecond))
	// Its deadline is twice a quarter interval after a failure (deadline).
	retry := t0.Add(leaseDuration(sec) - sec/2)
	if c.due(retry.Add(-1), false) || !c.due(retry, false) {
		t.Fatalf("the retry must come its sync deadline before the lease lapses, at %v", retry.Sub(t0))
	}
	// That retry fails too: the lease will lapse, and the retries go back to their jitter.
	c.reports(retry)
	c.failed(retry, retry.Add(250*time.Millisecond))
	if c.due(retry.Add(sec), false) {
		t.Fatal("a second failure must not retry early again")
	}
}

func TestUsageReportIsResentUntilAcknowledged(t *testing.T) {
	c := newTestCore(Spec{Name: "b", Rate: 1, Burst: 1})
	c.absorb(t0, []budget.Usage{{Key: "", Used: 2, Offered: 1}})
	first := c.reports(t0)[0][0]
	if first.seq == 0 || first.used != 2 {
		t.Fatalf("first report: %+v", first)
	}
	c.failed(t0, t0.Add(time.Millisecond))
	c.absorb(t0.Add(sec), []budget.Usage{{Key: "", Used: 3, Offered: 1}})
	retry := c.reports(t0.Add(sec))[0]
	if retry[0].seq != first.seq || retry[0].used != 2 {
		t.Fatalf("the retry must resend seq %d with 2s, got %+v", first.seq, retry[0])
	}
	c.applied(t0.Add(sec), t0.Add(sec+1), retry, []result{{live: 1}})
	c.absorb(t0.Add(2*sec), nil)
	next := c.reports(t0.Add(2 * sec))[0][0]
	if next.seq <= first.seq || next.used != 3 {
		t.Fatalf("after the acknowledgement, a new seq with the 3s used since: %+v", next)
	}
}

func TestExpectedInstancesAreRemembered(t *testing.T) {
	c := newTestCore(Spec{Name: "b", Rate: 8, Burst: 8, MaxConcurrent: 8})
	c.absorb(t0, []budget.Usage{{Key: "", Offered: 100}})
	grantAll(c, t0, func(string) result { return result{lease: budget.Lease{Rate: 1, Burst: 1, Slots: 1}, live: 8} })
	// Redis restarted: it lists one instance, but the 8 seen a moment ago may still run on
	// their fallback share, so the next reports say 8 are expected, for expectWindow
	// intervals.
	grantAll(c, t0.Add(sec), func(string) result { return result{lease: budget.Lease{Rate: 1, Burst: 1, Slots: 1}, live: 1} })
	c.absorb(t0.Add(2*sec), []budget.Usage{{Key: "", Offered: 100}})
	if got := c.reports(t0.Add(2 * sec))[0][0].expected; got != 8 {
		t.Fatalf("expected instances one interval after seeing 8: %d", got)
	}
	c.absorb(t0.Add(11*sec), []budget.Usage{{Key: "", Offered: 100}})
	reps := c.reports(t0.Add(11 * sec))
	if got := reps[0][0].expected; got != 1 {
		t.Fatalf("expected instances %d intervals after seeing 8: %d, want the 1 seen since", expectWindow, got)
	}

	// While failing, every sighting counts however old (the others may be failing too),
	// and after the recovery for another lease duration.
	c.failed(t0.Add(11*sec), t0.Add(11*sec))
	c.absorb(t0.Add(60*sec), []budget.Usage{{Key: "", Offered: 100}})
	reps = c.reports(t0.Add(60 * sec))
	if got := reps[0][0].expected; got != 8 {
		t.Fatalf("expected instances after a minute of failing: %d, want 8", got)
	}
	c.applied(t0.Add(60*sec), t0.Add(60*sec), reps[0], []result{{live: 1}})
	c.absorb(t0.Add(62*sec), []budget.Usage{{Key: "", Offered: 100}})
	if got := c.reports(t0.Add(62 * sec))[0][0].expected; got != 8 {
		t.Fatalf("expected instances two intervals after the recovery: %d, want 8", got)
	}
}

func TestNotAfterFollowsRedisClock(t *testing.T) {
	c := newTestCore(Spec{Name: "b", Rate: 1})
	if got := c.notAfter(t0, 250*time.Millisecond); got != 0 {
		t.Fatalf("before any reply: %d, want no limit", got)
	}
	c.clock(5_000_000, t0)
	if got := c.notAfter(t0.Add(sec), 250*time.Millisecond); got != 5_000_000+1_500_000 {
		t.Fatalf("notAfter = %d, want Redis time at the last reply + 1 s since + twice the deadline", got)
	}
}

func TestIdlePartitionIsLeft(t *testing.T) {
	c := newTestCore(Spec{Name: "b", Rate: 1, Burst: 1, MaxConcurrent: 2})
	c.absorb(t0, []budget.Usage{{Key: "tenant", Offered: 1}})
	ok := func(string) result { return result{lease: budget.Lease{Rate: 1, Burst: 1, Slots: 1}, live: 1} }
	grantAll(c, t0, ok)
	var left []string
	for i := 1; i <= idleSyncs+1; i++ {
		at := t0.Add(time.Duration(i) * sec)
		c.absorb(at, nil)
		for _, reps := range c.reports(at) {
			res := make([]result, len(reps))
			for j := range res {
				res[j] = ok("")
			}
			if i <= idleSyncs && reps[0].leave {
				t.Fatalf("sync %d: left too early", i)
			}
			left = append(left, c.applied(at, at, reps, res)...)
		}
	}
	if len(left) != 1 || left[0] != "tenant" || len(c.parts) != 0 {
		t.Fatalf("after %d idle syncs: dropped %q, %d partitions left", idleSyncs+1, left, len(c.parts))
	}
}

// TestSyncsGoRoundInTheSameOrder: each sync reports the partitions in the order they came,
// so that a partition is renewed a sync's length after its last renewal; a partition that
// left is gone from the order, and one that comes back goes last.
func TestSyncsGoRoundInTheSameOrder(t *testing.T) {
	c := newTestCore(Spec{Name: "b", Rate: 1, Burst: 1})
	var usage []budget.Usage
	for i := range 600 { // three calls' worth
		usage = append(usage, budget.Usage{Key: fmt.Sprintf("tenant-%d", i), Offered: 0.001})
	}
	order := func(at time.Time) []string {
		var keys []string
		for _, reps := range c.reports(at) {
			res := make([]result, len(reps))
			for i, r := range reps {
				keys = append(keys, r.p.key)
				res[i] = result{lease: budget.Lease{Rate: 0.001, Burst: 0.001}, live: 1}
			}
			c.applied(at, at, reps, res)
		}
		return keys
	}
	c.absorb(t0, usage)
	first := order(t0)
	for i, u := range usage {
		if first[i] != u.Key {
			t.Fatalf("first sync: partition %d is %q, want %q (the order they came in)", i, first[i], u.Key)
		}
	}
	c.absorb(t0.Add(sec), usage)
	if again := order(t0.Add(sec)); !slices.Equal(again, first) {
		t.Fatalf("second sync: another order")
	}

	// tenant-1 goes idle until it leaves, then comes back.
	at := t0.Add(sec)
	for i := 0; i <= idleSyncs; i++ {
		at = at.Add(sec)
		c.absorb(at, slices.Concat(usage[:1], usage[2:]))
		order(at)
	}
	if _, ok := c.parts["tenant-1"]; ok {
		t.Fatalf("tenant-1 idle for %d syncs: not left", idleSyncs+1)
	}
	at = at.Add(sec)
	c.absorb(at, usage)
	want := slices.Concat(first[:1], first[2:], first[1:2])
	if got := order(at); !slices.Equal(got, want) {
		t.Fatalf("after tenant-1 left and came back: %d partitions, first %q, last %q; want %d, last tenant-1",
			len(got), got[0], got[len(got)-1], len(want))
	}
}

func TestPushesOnlyChanges(t *testing.T) {
	c := newTestCore(Spec{Name: "b", Rate: 1, Burst: 1})
	c.absorb(t0, []budget.Usage{{Key: "a", Offered: 1}, {Key: "b", Offered: 1}})
	grantAll(c, t0, func(k string) result { return result{lease: budget.Lease{Rate: 0.5, Burst: 0.5}, live: 2} })
	if got := len(c.pushes(t0)); got != 2 {
		t.Fatalf("first pushes: %d, want 2", got)
	}
	if got := c.pushes(t0.Add(sec)); len(got) != 0 {
		t.Fatalf("unchanged leases pushed again: %+v", got)
	}
}

func TestHashTagAndKeys(t *testing.T) {
	for _, tc := range []struct{ budget, want string }{
		{"reporting", "pgtraffic:{reporting}:p3"},
		{"a{b}c", "pgtraffic:{a%7Bb%7Dc}:p3"},
		{"50%", "pgtraffic:{50%25}:p3"},
		{"a@b", "pgtraffic:{a%40b}:p3"},
	} {
		if got := PartitionsKey("", tc.budget); got != tc.want {
			t.Errorf("PartitionsKey(%q) = %q, want %q", tc.budget, got, tc.want)
		}
	}
	// A budget of a database named has keys of its own, which hold no part of the name.
	shard1, shard2 := PartitionsKey("app@db1:5432/app", "reporting"), PartitionsKey("app@db2:5432/app", "reporting")
	if shard1 == shard2 || shard1 == PartitionsKey("", "reporting") {
		t.Errorf("two databases' budgets of one name share a key: %q, %q", shard1, shard2)
	}
	if !strings.HasPrefix(shard1, "pgtraffic:{reporting@") || strings.Contains(shard1, "db1") {
		t.Errorf("a database's budget's key %q", shard1)
	}
	if a, b := QuarantineKey("x", "q", QuarantineSpec{After: 1, For: time.Second}),
		QuarantineKey("y", "q", QuarantineSpec{After: 1, For: time.Second}); a == b {
		t.Errorf("two databases' quarantines share the key %q", a)
	}
	for _, p := range []string{"", "acme"} {
		if got := partitionField(p); got != p {
			t.Errorf("partitionField(%q) = %q, want it verbatim", p, got)
		}
	}
	long := partitionField(string(make([]byte, 1000)))
	if len(long) > 40 {
		t.Errorf("a long partition value makes a %d-byte field", len(long))
	}
	if partitionField(string(make([]byte, 1000))) == partitionField(string(make([]byte, 999))) {
		t.Error("distinct long partitions share a field")
	}
}

// packResults is what the script returns for results of 13 numbers each.
func packResults(rs ...[]float64) string {
	var b []byte
	for _, r := range rs {
		for _, x := range r {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
		}
	}
	return string(b)
}

func TestDecodeResults(t *testing.T) {
	good := packResults([]float64{0.5, 1, 2, 3, 0.25, 0.5, 2, 1500, 1, 2, 4, 1, 0.125})
	res, err := decodeResults(good, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := result{lease: budget.Lease{Rate: 0.5, Burst: 1, Slots: 2}, live: 3, debt: 0.25, target: 0.5, targetSlots: 2,
		retake: 1500 * time.Microsecond, inForce: Limits{Rate: 1, Burst: 2, MaxConcurrent: 4}, differ: true, hold: 0.125}
	if res[0] != want {
		t.Fatalf("decoded %+v, want %+v", res[0], want)
	}
	for _, bad := range []string{"", "x", good[:len(good)-1], good + good} {
		if _, err := decodeResults(bad, 1); err == nil {
			t.Errorf("decodeResults(%q) accepted", bad)
		}
	}
	// Any bytes are numbers: NaN and infinities come out of the clamp within the budget.
	nan := packResults([]float64{math.NaN(), math.Inf(1), math.Inf(1), math.NaN(), math.Inf(1), math.NaN(),
		math.Inf(-1), math.Inf(1), math.NaN(), math.Inf(1), math.Inf(1), math.NaN(), math.Inf(1)})
	res, err = decodeResults(nan, 1)
	if err != nil {
		t.Fatal(err)
	}
	spec := Spec{Rate: 1, Burst: 2, MaxConcurrent: 4}
	res[0].clamp(spec, 2500*time.Millisecond)
	if l := res[0].lease; l.Rate != 0 || l.Burst != 2 || l.Slots != 4 || res[0].retake != 2500*time.Millisecond || res[0].hold != 2 {
		t.Errorf("a forged result, clamped: %+v", res[0])
	}
	for _, bad := range [][]any{{"1", int64(0)}, {"1", int64(0), []any{}}, {"1", int64(0), good, good}} {
		if _, err := decodeReply(bad, 1, nil); err == nil {
			t.Errorf("decodeReply(%v) accepted", bad)
		}
	}
	if r, err := decodeReply([]any{"123", int64(1)}, 1, nil); !errors.Is(err, errStale) || r.now != 123 {
		t.Errorf("a stale reply: %+v, %v", r, err)
	}
	if r, err := decodeReply([]any{"7", int64(0), good}, 1, nil); err != nil || r.now != 7 || r.results[0] != want {
		t.Errorf("a reply: %+v, %v", r, err)
	}
}

func TestClientForHidesCredentials(t *testing.T) {
	_, err := New(Options{URL: "redis://:hunter2@h:6379/notadb", Interval: sec})
	if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "redis://xxxxx@h:6379/notadb") {
		t.Fatalf("error %v", err)
	}
	c, err := clientFor("redis://:hunter2@h:6379/3", sec)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if o := c.Options(); !o.ContextTimeoutEnabled || o.DB != 3 || o.Password != "hunter2" || o.MaxRetries != -1 && o.MaxRetries != 0 {
		t.Fatalf("options: %+v", o)
	}
}

// TestLongInstanceIDIsRefused: a partition's value gives each instance id a 16-bit length.
func TestLongInstanceIDIsRefused(t *testing.T) {
	if _, err := New(Options{Instance: strings.Repeat("x", maxInstanceLen+1)}); err == nil {
		t.Fatal("an instance id longer than maxInstanceLen was taken")
	}
	c, err := New(Options{Instance: strings.Repeat("x", maxInstanceLen)})
	if err != nil || c.Instance() != strings.Repeat("x", maxInstanceLen) {
		t.Fatalf("an instance id of maxInstanceLen bytes: %v", err)
	}
}

func TestDemandIsEstimatedPerSync(t *testing.T) {
	c := newTestCore(Spec{Name: "b", Rate: 1, Burst: 1, MaxConcurrent: 8})
	c.reports(t0) // the window starts at a sync
	// Two reports within one interval: 0.25 s and 0.75 s offered, peaks of 3 and 5 slots.
	c.absorb(t0.Add(sec/2), []budget.Usage{{Key: "", Offered: 0.25, Wanted: 3}})
	c.absorb(t0.Add(sec*9/10), []budget.Usage{{Key: "", Offered: 0.75, Wanted: 5, InFlight: 2}})
	rep := c.reports(t0.Add(sec))[0][0]
	if !near(rep.demand, 1) || rep.want != 5 || rep.inflight != 2 {
		t.Fatalf("after 1 s offered in 1 s, peak 5: demand %v, want %d, in flight %d", rep.demand, rep.want, rep.inflight)
	}
	c.failed(t0.Add(sec), t0.Add(sec))
	// A quiet interval halves the estimate; it does not drop it.
	rep = c.reports(t0.Add(2 * sec))[0][0]
	if !near(rep.demand, 0.5) || rep.want != 3 || rep.inflight != 0 {
		t.Fatalf("after a quiet interval: demand %v, want %d, in flight %d", rep.demand, rep.want, rep.inflight)
	}
}

func TestReportSaysWhenItsUsageRan(t *testing.T) {
	ms := func(d time.Duration) time.Time { return t0.Add(d) }
	// Without a lease, or with a young one (a cold start), a report on time counts as run
	// when it arrives; held back by failed syncs, as if it had come on time.
	c := newTestCore(Spec{Name: "b", Rate: 1, Burst: 1})
	c.absorb(t0, []budget.Usage{{Key: "", Used: 1, Offered: 1}})
	if r := c.reports(t0)[0][0]; r.age != 0 {
		t.Fatalf("a report of usage that just began: age %v, want 0", r.age)
	}
	c.failed(t0, ms(time.Millisecond))
	if r := c.reports(ms(sec))[0][0]; r.age != 0 {
		t.Fatalf("no lease, an interval after its usage began: age %v, want 0", r.age)
	}
	c.failed(ms(sec), ms(sec))
	if r := c.reports(ms(3 * sec))[0][0]; r.age != 2*sec {
		t.Fatalf("no lease, held back 3 s after its usage began: age %v, want the 2 s it is late", r.age)
	}

	// With a lease older than youngLease intervals: in the middle of the interval a report
	// covers, or of its first interval when held back.
	c = newTestCore(Spec{Name: "b", Rate: 1, Burst: 1})
	c.absorb(ms(-10*sec), []budget.Usage{{Key: "", Offered: 1}})
	ok := func(string) result { return result{lease: budget.Lease{Rate: 1, Burst: 1}, live: 1} }
	grantAll(c, ms(-10*sec), ok)
	grantAll(c, ms(-sec), ok)
	c.absorb(t0, []budget.Usage{{Key: "", Used: 1, Offered: 1}})
	r := c.reports(t0)[0][0]
	if r.age != sec/2 {
		t.Fatalf("an interval after its usage began: age %v, want the middle of the interval", r.age)
	}
	c.failed(t0, t0)
	if r := c.reports(ms(2 * sec))[0][0]; r.age != 5*sec/2 || r.used != 1 {
		t.Fatalf("held back 3 s after its usage began: %+v, want age 2.5 s, the middle of its first interval", r)
	}
	c.applied(ms(2*sec), ms(2*sec), []report{r}, []result{{lease: budget.Lease{Rate: 1, Burst: 1}, live: 1}})
	// The usage gathered meanwhile began with the held-back report.
	c.absorb(ms(2500*time.Millisecond), []budget.Usage{{Key: "", Used: 2, Offered: 1}})
	if r := c.reports(ms(3 * sec))[0][0]; r.used != 2 || r.age != 5*sec/2 {
		t.Fatalf("the usage held back since the report at 0: %+v, want 2 s used, age 2.5 s", r)
	}
}

func TestReportAfterAFailureIsRecovering(t *testing.T) {
	c := newTestCore(Spec{Name: "b", Rate: 1, Burst: 1})
	c.absorb(t0, []budget.Usage{{Key: "", Offered: 1}})
	if r := c.reports(t0)[0][0]; r.recovering {
		t.Fatal("a first report is not recovering")
	}
	c.failed(t0, t0.Add(time.Millisecond))
	r := c.reports(t0.Add(sec))[0][0]
	if !r.recovering {
		t.Fatal("the report after a failed sync must say so")
	}
	c.applied(t0.Add(sec), t0.Add(sec), []report{r}, []result{{live: 1}})
	if r := c.reports(t0.Add(2 * sec))[0][0]; r.recovering {
		t.Fatal("after a sync that went well, not recovering")
	}
}

// TestDeadlineGrowsWhileFailing: a sync's calls may take a quarter interval; after failed syncs
// twice and then four times that (a call on a new connection pays its handshake within it),
// never more; a success brings the quarter back. Before its first success a core's syncs have
// the longest (its first call is on a new connection too). The retry of a lease in force is sent a
// deadline before the lease lapses, so that it ends before the lease does.
func TestDeadlineGrowsWhileFailing(t *testing.T) {
	c := newTestCore(Spec{Name: "b", MaxConcurrent: 4})
	c.absorb(t0, []budget.Usage{{Key: "", Wanted: 1}})
	grantAll(c, t0, func(string) result { return result{lease: budget.Lease{Slots: 4}, live: 1} })
	want := []time.Duration{sec / 4, sec / 2, sec, sec, sec}
	for i, d := range want {
		if got := c.deadline(); got != d {
			t.Fatalf("after %d failed syncs: deadline %v, want %v", i, got, d)
		}
		sent := t0.Add(time.Duration(i+1) * sec / 10)
		c.failed(sent, sent.Add(time.Millisecond))
		if retry, lapse := c.next, c.parts[""].expires; retry.Add(c.deadline()).After(lapse) {
			t.Fatalf("after %d failed syncs: the retry at %v with a %v deadline may end after the lease lapses at %v",
				i+1, retry.Sub(t0), c.deadline(), lapse.Sub(t0))
		}
	}
	grantAll(c, t0.Add(sec), func(string) result { return result{lease: budget.Lease{Slots: 4}, live: 1} })
	if got := c.deadline(); got != sec/4 {
		t.Fatalf("after a successful sync: deadline %v, want a quarter interval again", got)
	}
	small := newCore(Spec{Name: "b"}, 200*time.Millisecond, 10, func() float64 { return 0.5 })
	if got := small.deadline(); got != 4*minDeadline {
		t.Fatalf("sync_interval 200ms, before its first sync (a call on a new connection): deadline %v, want four times the %v floor", got, minDeadline)
	}
	small.absorb(t0, []budget.Usage{{Key: "", Wanted: 1}})
	grantAll(small, t0, func(string) result { return result{lease: budget.Lease{Slots: 4}, live: 1} })
	if got := small.deadline(); got != minDeadline {
		t.Fatalf("sync_interval 200ms: deadline %v, want the %v floor", got, minDeadline)
	}
}

// TestIdleDemandFallsToNoSlot: an instance that wanted one slot and then nothing reports no
// demand from its second idle sync on, as the rounding of the estimate says (estimator.slots),
// so that Redis gives the slot to the instances that want it; a demand of four slots is gone
// three syncs later (4, 2, 1, 0.5, 0.25). The unkeyed partition, kept while idle, goes on
// being reported meanwhile.
func TestIdleDemandFallsToNoSlot(t *testing.T) {
	for _, tc := range []struct {
		peak int
		want []int // the slots reported at the syncs from the peak's on, one interval apart
	}{
		{1, []int{1, 1, 0, 0, 0, 0}},
		{2, []int{2, 1, 1, 0, 0}},
		{4, []int{4, 2, 1, 1, 0, 0}},
	} {
		t.Run(fmt.Sprint(tc.peak), func(t *testing.T) {
			c := newTestCore(Spec{Name: "b", MaxConcurrent: 8})
			c.keepUnkeyed(t0)
			ok := func(string) result { return result{lease: budget.Lease{Slots: 4}, live: 2} }
			grantAll(c, t0, ok)
			var got []int
			for i := range tc.want {
				at := t0.Add(time.Duration(i+1) * sec)
				if i == 0 {
					c.absorb(at, []budget.Usage{{Key: "", Wanted: tc.peak}})
				} else {
					c.absorb(at, nil)
				}
				reps := c.reports(at)
				if len(reps) != 1 || len(reps[0]) != 1 || reps[0][0].leave {
					t.Fatalf("sync %d: %d chunks, want the kept unkeyed partition", i, len(reps))
				}
				got = append(got, reps[0][0].want)
				c.applied(at, at, reps[0], []result{ok("")})
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("a peak of %d, then idle: reported %v, want %v", tc.peak, got, tc.want)
			}
		})
	}
}

// TestPartitionWithWaitersIsNotLeft: a partition whose statements wait for its room (max_wait)
// is not idle, though nothing of it runs, is offered or refused anew: the instance keeps
// reporting it and does not leave it, whose slots the waiters wait for. Once they are gone it
// is left after idleSyncs more syncs, as any idle partition.
func TestPartitionWithWaitersIsNotLeft(t *testing.T) {
	c := newTestCore(Spec{Name: "b", Rate: 1, Burst: 1, MaxConcurrent: 2})
	c.absorb(t0, []budget.Usage{{Key: "tenant", Offered: 1, Wanted: 2, Starved: true}})
	ok := func(string) result { return result{lease: budget.Lease{Rate: 1, Burst: 1}, live: 2} }
	grantAll(c, t0, ok)
	sync := func(i int, usage []budget.Usage) (reported, left bool) {
		at := t0.Add(time.Duration(i) * sec)
		c.absorb(at, usage)
		for _, reps := range c.reports(at) {
			res := make([]result, len(reps))
			for j := range res {
				res[j] = ok("")
			}
			for _, r := range reps {
				reported = reported || r.p.key == "tenant"
			}
			left = left || len(c.applied(at, at, reps, res)) > 0
		}
		return reported, left
	}
	i := 1
	for ; i <= 3*idleSyncs; i++ {
		if reported, left := sync(i, []budget.Usage{{Key: "tenant", Waiting: 1}}); !reported || left {
			t.Fatalf("sync %d with a statement waiting: reported %v, left %v; want reported and kept", i, reported, left)
		}
	}
	for n := 1; n <= idleSyncs+1; n, i = n+1, i+1 {
		_, left := sync(i, nil)
		if left != (n == idleSyncs+1) {
			t.Fatalf("idle sync %d after the waiter went: left %v, want left at the %dth", n, left, idleSyncs+1)
		}
	}
}
