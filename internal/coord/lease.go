package coord

import (
	"math"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/budget"
)

// Spec is the global limits of one shared budget: what every instance together may use.
// A zero field means that limit is off (as in the rules file), and the matching field of a
// [Lease] is then zero and to be ignored.
type Spec struct {
	Name string
	// Rate is the budget's drain rate in execution seconds per second
	// (server_share × server_cores); 0 means no bucket.
	Rate float64
	// Burst is the budget's bucket size in execution seconds (burst_limit).
	Burst float64
	// MaxConcurrent is how many of the budget's statements may be in flight across every
	// instance, per partition; 0 is unlimited.
	MaxConcurrent int
	// Quarantine, when set, shares the budget's quarantines with the other instances (see
	// [QuarantineSpec]); zero: it shares none.
	Quarantine QuarantineSpec
	// Warn says the budget is in warn mode on this instance: its statements beyond its lease
	// run anyway (those enforce would have wait, budget.TakeWaiter), holding no slot that
	// enforce would give them, so it reports at most its lease's slots as held. Else, in a
	// rolling deploy from warn to enforce, the instances still on warn would hold the
	// slots of those already on enforce.
	Warn bool
}

// normalize maps invalid values to "off", as the budget package does.
func (s Spec) normalize() Spec {
	if !(s.Rate > 0) || math.IsInf(s.Rate, 1) {
		s.Rate, s.Burst = 0, 0
	} else if !(s.Burst > 0) || math.IsInf(s.Burst, 1) {
		s.Burst = budget.DefaultBurst(s.Rate)
	}
	if s.MaxConcurrent < 0 {
		s.MaxConcurrent = 0
	}
	if s.Quarantine.After < 1 || s.Quarantine.For <= 0 {
		s.Quarantine = QuarantineSpec{}
	}
	return s
}

// active reports whether u says anything: a partition with nothing offered, used, wanted, in
// flight or waiting is idle.
func active(u *budget.Usage) bool {
	return u.Offered > 0 || u.Used > 0 || u.Wanted > 0 || u.InFlight > 0 || u.Waiting > 0 || u.Starved
}

// Local is the process-local budget that a coordinator steers: it enforces, per partition,
// exactly the lease it was given last, and counts what the coordinator needs to size the
// next one. See the package documentation for the precise contract.
//
// The coordinator calls Local from its own goroutine, never under its lock and never on a
// statement's path; implementations must be safe for concurrent use with their hot path.
type Local interface {
	// TakeUsage appends to dst the usage of every partition active since the previous call,
	// resets their counters, and returns the extended slice.
	TakeUsage(now time.Time, dst []budget.Usage) []budget.Usage
	// SetLease makes lease the partition's limits from now on, keeping its in-flight count
	// and its debt (a debt above the new burst forgiven down to it by at most the burst the
	// lease lost). A zero lease is no credit and no slot.
	SetLease(now time.Time, key string, lease budget.Lease)
	// DropLease says the coordinator left the partition: the budget may forget it once it is
	// idle, and holds it to the provisional lease until then.
	DropLease(now time.Time, key string)
	// SetProvisional makes lease, for owner, the limits of each partition the budget meets
	// without a lease from the coordinator (new to it, or dropped), until its lease arrives.
	SetProvisional(owner any, lease budget.Lease)
	// SetShared makes the partitions' limits their leases from now on, for owner, the
	// registration that shares the budget: the partitions the budget holds keep its own
	// limits until their leases arrive, and those it meets later start on the provisional
	// lease. The budget calls kick when it refuses or delays a statement for want of its
	// lease, or admits one on a lease the coordinator did not give, and tells a statement
	// without credit to retry after retry. A nil kick makes the budget's own limits apply
	// again, unless another owner shared it since (a coordinator that replaced this one at a
	// reload).
	SetShared(now time.Time, owner any, kick func(), retry time.Duration)
}

// *budget.Budget is the Local that the engine registers.
var _ Local = (*budget.Budget)(nil)

// estimator smooths a rate that rises fast and falls slowly: a rise is taken at once (a
// partition that wants more must get it at the next sync), a fall halves the gap every
// halfLife (one burst of quiet must not give its share away). The slow fall keeps a bursty
// instance's slots while no other instance needs them: when another is kept short and says so
// on the want channel, the holder's half-life is an eighth of an interval (core.roll), so that
// slots held for a demand that stopped move within a few early syncs, not over 1 + log2 N
// intervals.
type estimator struct {
	v float64
}

func (e *estimator) add(x float64, dt, halfLife time.Duration) float64 {
	if x >= e.v || halfLife <= 0 {
		e.v = x
		return e.v
	}
	keep := math.Exp2(-float64(dt) / float64(halfLife))
	e.v = x + (e.v-x)*keep
	return e.v
}

// slots is the estimate as a number of slots: rounded to the nearest, a half up. A demand that
// stops falls to none once its estimate is below one half, more than 1 + log2 N intervals
// after it stopped at N slots (the second regular sync for one slot). Rounded up, the
// fraction left of a demand that stopped would count as a whole slot, held from the other
// instances, for about thirty intervals, the halvings down to a billionth. A steady demand is
// its peak; a falling one halves towards its new peak, to within half a slot.
func (e *estimator) slots() int {
	return int(math.Floor(e.v + 0.5))
}

// fallbackLease is a partition's share when it cannot ask Redis: the budget divided by the
// instances known to share it. Slots are rounded down, but an instance keeps at least one
// slot, because an internal failure must not stop every statement of the budget; with more
// instances than max_concurrent, an outage may therefore let one statement per instance run.
func fallbackLease(s Spec, instances int) budget.Lease {
	n := float64(max(instances, 1))
	l := budget.Lease{Rate: s.Rate / n, Burst: s.Burst / n}
	if s.MaxConcurrent > 0 {
		l.Slots = max(1, s.MaxConcurrent/max(instances, 1))
	}
	return l
}

// decay moves from a lease towards target, halving the gap every halfLife after since.
// Every instance that lost Redis decays at the same pace towards the same share, so the sum
// of their rates, within the budget when they lost it, stays within it.
func decay(from, target budget.Lease, since, now time.Time, halfLife time.Duration) budget.Lease {
	if !now.After(since) || halfLife <= 0 {
		return from
	}
	keep := math.Exp2(-float64(now.Sub(since)) / float64(halfLife))
	if keep < 1e-3 {
		return target
	}
	l := budget.Lease{
		Rate:  target.Rate + (from.Rate-target.Rate)*keep,
		Burst: target.Burst + (from.Burst-target.Burst)*keep,
		Slots: int(math.Round(float64(target.Slots) + float64(from.Slots-target.Slots)*keep)),
	}
	return l
}

// capLease returns l with each field at most that of limit.
func capLease(l, limit budget.Lease) budget.Lease {
	return budget.Lease{Rate: min(l.Rate, limit.Rate), Burst: min(l.Burst, limit.Burst), Slots: min(l.Slots, limit.Slots)}
}
