package budget

import (
	"container/heap"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// A shared budget is a budget whose limits hold across every instance of an
// application. Its admission is the same as a local budget's: only each key's drain rate,
// bucket size and concurrency limit come from the key's lease, which a coordinator (the
// package above this one) sets through [Budget.SetLease], instead of from the Spec. The
// Spec still says which limits are on, and its per-query limit and burst bound every
// statement as before.
//
// A key the coordinator has given no lease (new to the budget, or back after the coordinator
// dropped it) runs on the provisional lease the coordinator set with [Budget.SetProvisional],
// with no network call on the statement's path, until its own lease arrives; its first
// statement kicks the coordinator, which leases it at an early sync. The keys a budget holds
// when it becomes shared keep its own limits until their leases arrive, as it enforced them
// until then: a reload that shares a running budget refuses nothing that it admitted before.

// Lease is the part of a shared budget's limits that one instance may use for one partition
// until the next sync: the local bucket drains at Rate with size Burst, and at most Slots of
// the partition's statements are in flight here. A zero Rate (in a budget with a rate) means no
// credit and zero Slots (in one with max_concurrent) means no slot: not "unlimited".
type Lease struct {
	Rate  float64 // execution seconds per second
	Burst float64 // execution seconds
	Slots int     // statements in flight
	// Debt is the lease's share of the budget's global debt when it was granted (execution
	// seconds): the local bucket holds at least that much debt from then on, so that the
	// instances' buckets together never offer more room than the global bucket has.
	Debt float64
}

// Usage is what a shared budget reports about one partition (the value of the budget's `per` tag,
// "" without one) that was active since its previous report.
type Usage struct {
	Key string
	// Offered is the predicted execution seconds of the statements that asked to run since the
	// previous report, admitted or refused: the partition's demand, not what it was allowed.
	Offered float64
	// Used is the actual execution seconds of the statements that completed since the
	// previous report.
	Used float64
	// Wanted is the largest number of statements that wanted a slot at once since the
	// previous report: those in flight plus those refused (or waiting) for want of a slot. A
	// statement still waiting for the partition's room (max_wait) counts at every report
	// until it is admitted or leaves, not only at the report after it was refused.
	Wanted int
	// InFlight is the number of statements in flight now.
	InFlight int
	// Waiting is the number of statements waiting for the partition's room now (max_wait):
	// a partition they wait for is not idle, whatever else it reports.
	Waiting int
	// Starved says a statement was refused, or waited, for want of credit or of a slot since
	// the previous report (one still waiting included).
	Starved bool
	// Debt is the partition's debt now, execution seconds: what its bucket holds of the
	// usage that the budget's global bucket counts too.
	Debt float64
	// Provisional says the partition runs on a lease the coordinator did not set for it: the
	// provisional lease of a key new to the budget, or evicted from its table and back, or
	// the budget's own limits kept since it became shared.
	Provisional bool
}

// link is a shared budget's tie to its coordinator.
type link struct {
	owner any           // the registration that made the budget shared (SetShared)
	kick  func()        // asks the coordinator for an early sync; nil in a local budget
	retry time.Duration // RetryAfter of a key without credit: when its lease may arrive
}

// part is one key's partition of a shared budget: its lease and what it reports at the next
// sync. Guarded by the budget's mutex.
type part struct {
	lease   Lease
	leased  bool    // lease is the coordinator's (SetLease), not a provisional one
	offered float64 // predicted seconds of the statements that asked, admitted or refused
	used    float64 // actual seconds of the statements released
	wanted  int     // most statements that wanted a slot at once
	queued  int     // statements refused for want of a slot since the last report
	starved bool    // a statement was refused for want of credit or a slot
}

// SetShared makes b shared at now by owner, the coordinator's registration of it: from then
// on each key's limits are its lease. The keys b holds keep its own limits until the
// coordinator leases them, and a key it meets later starts on the provisional lease
// ([Budget.SetProvisional]; none, no credit and no slot, until one is set). b calls kick when
// it refuses a statement for want of its lease or admits one on a lease it was not given.
// retry is the RetryAfter of a key without credit. A nil kick makes b local again (the
// Spec's limits apply to every key), but only from the owner that shared it last: after a
// reload that replaced the coordinator, the old one's registration, ended after the new one's
// began, leaves b shared by the new. Debt and in-flight counts are kept either way.
func (b *Budget) SetShared(now time.Time, owner any, kick func(), retry time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := &b.keys
	if kick == nil && k.shared && b.link.owner != owner {
		return // shared by a later registration
	}
	b.link = link{owner: owner, kick: kick, retry: retry}
	if (kick != nil) == k.shared {
		return
	}
	own := Lease{Rate: k.spec.Rate, Burst: k.spec.Burst, Slots: k.spec.MaxConcurrent}
	for _, s := range k.all() {
		s.Charge(now, k.rate(s), 0) // drained at the old rate until now
		s.part = nil
		if kick != nil {
			// The limits it enforced a moment ago: its statements in flight ran under them
			// unseen by the other instances, and a lease replaces them a round trip from now.
			s.part = &part{lease: own}
		}
	}
	k.shared = kick != nil
	k.setSpec(now, k.spec) // the idle order under the new rates
	b.wakeAll()            // a new lease may be a waiter's room
}

// SetProvisional makes lease the limits of each key that b meets from now on without a lease
// from its coordinator, until the coordinator leases it: a key new to b, or dropped and back
// (see [Budget.DropLease]). The keys already on a provisional lease keep theirs, since their
// own leases are on their way. owner is as in [Budget.SetShared]: while b is shared by
// another registration, nothing changes. It may be called before SetShared, so that b never
// meets a key without it.
func (b *Budget) SetProvisional(owner any, lease Lease) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := &b.keys
	if k.shared && b.link.owner != owner {
		return
	}
	k.provisional = k.bound(lease)
}

// SetLease makes lease the limits of key's partition from now on. Its debt so
// far drains at the old rate until now; a debt above the new burst is forgiven down to it by
// at most the burst the lease lost (a debt run up under a larger lease would otherwise shut
// the partition out long after the global bucket drained it, while a debt that a statement
// larger than the burst ran up stays owed), and then raised to the lease's share of the
// global debt. A zero lease is no credit and no slot, the partition kept: the other
// instances hold the budget.
func (b *Budget) SetLease(now time.Time, key string, lease Lease) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := &b.keys
	if !k.shared {
		return
	}
	s := k.lookup(key)
	if s == nil {
		s = k.insert(key, now)
	}
	k.relet(now, s, k.bound(lease), true)
	b.wakeAll() // a new lease may be a waiter's room
}

// DropLease tells b at now that its coordinator left key's partition (it stood idle): the
// partition is forgotten once idle (nothing in flight or waiting) with no debt left; until
// then it runs on the provisional lease, as a key b meets anew, and the coordinator leases it
// again if it reports usage. Either way its waiters are woken to be decided again.
func (b *Budget) DropLease(now time.Time, key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := &b.keys
	s := k.lookup(key)
	if !k.shared || s == nil {
		return
	}
	if s.inflight == 0 && b.waitingFor(s) == 0 && s.DebtAt(now, s.part.lease.Rate) == 0 {
		k.remove(s)
	} else {
		k.relet(now, s, k.provisional, false)
	}
	// Dropped or on the provisional lease, its waiters are decided again under the limits
	// of an absent key or the provisional ones: either may be their room.
	b.wakeAll()
}

// waitingFor is how many statements wait for s's room: its key's queue, or in a Keyless
// budget (every key counted under the unkeyed state) every queue. The caller holds b.mu.
func (b *Budget) waitingFor(s *state) int {
	if s == b.keys.unkeyed && b.keys.spec.Keyless {
		n := 0
		for _, q := range b.queues {
			n += q.len()
		}
		return n
	}
	return b.queues[s.key].len()
}

// relet makes lease, the coordinator's if leased, the limits of s at now (see SetLease).
func (k *keys) relet(now time.Time, s *state, lease Lease, leased bool) {
	old := s.part.lease
	if now.After(s.Last) {
		s.Debt, s.Last = s.DebtAt(now, old.Rate), now
	}
	s.Debt -= min(max(0, s.Debt-lease.Burst), max(0, old.Burst-lease.Burst))
	s.Debt = max(s.Debt, lease.Debt) // its share of the global debt (see Lease)
	s.part.lease, s.part.leased = lease, leased
	if s.idx >= 0 {
		s.emptyAt = s.Last.Add(s.emptyAfter(s.Last, lease.Rate))
		heap.Fix(&k.idle, s.idx)
	}
}

// TakeUsage appends to dst the usage of every partition active since the previous call, resets
// its counters, and returns the extended slice. O(number of keys), once per sync, a chunk of
// keys per hold of the lock as [Budget.Snapshot] reads them: a budget keyed per tenant may
// hold a hundred thousand keys, and building a sync must not keep its statements waiting. A
// key added during the walk may be left for the next call, which reports its counters then.
// The caller reuses dst from one sync to the next: grown key by key every time, the slice of
// a hundred thousand active partitions would be copied about twice over, and allocated anew.
func (b *Budget) TakeUsage(now time.Time, dst []Usage) []Usage {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := dst
	k := &b.keys
	if k.shared {
		// A key whose statements wait has a state to report them by, even if the table
		// evicted it (idle, nothing in flight) while they waited.
		for key := range b.queues {
			if k.lookup(key) == nil {
				k.insert(key, now)
			}
		}
	}
	take := func(s *state) {
		p := s.part
		if p == nil {
			return
		}
		// The statements waiting for its room still want a slot each beside those in flight:
		// a report that forgot them would tell the coordinator the partition wants nothing
		// while they wait, and it would give their slots away (or leave the partition).
		waiting := b.waitingFor(s)
		base := s.inflight
		if m := k.spec.MaxConcurrent; m > 0 {
			base = max(base, min(s.inflight+waiting, m))
		}
		u := Usage{Key: s.key, Offered: p.offered, Used: p.used, Wanted: max(p.wanted, base),
			InFlight: s.inflight, Waiting: waiting, Starved: p.starved || waiting > 0,
			Debt: s.DebtAt(now, p.lease.Rate), Provisional: !p.leased}
		if u.Offered > 0 || u.Used > 0 || u.Wanted > 0 || u.Starved {
			out = append(out, u)
		}
		*p = part{lease: p.lease, leased: p.leased, wanted: base}
	}
	if s := k.unkeyed; s != nil {
		take(s)
	}
	n := 0
	// As in Snapshot, ranging over the map across the unlocked pauses is sound.
	for _, s := range k.byKey {
		take(s)
		if n++; n%scrapeChunk == 0 {
			b.pause()
		}
	}
	return out
}

// bound returns l within the budget's own limits: whatever the coordinator computed (from
// numbers Redis gave it), one instance's lease never exceeds the whole budget, and a
// negative or non-finite number is none.
func (k *keys) bound(l Lease) Lease {
	sp := &k.spec
	return Lease{Rate: min(sanitizeCost(l.Rate), sp.Rate), Burst: min(sanitizeCost(l.Burst), sp.Burst),
		Slots: min(max(l.Slots, 0), sp.MaxConcurrent), Debt: sanitizeCost(l.Debt)}
}

// rate is the rate s drains at: its lease's in a shared budget, else the spec's.
func (k *keys) rate(s *state) float64 {
	if s.part != nil {
		return s.part.lease.Rate
	}
	return k.spec.Rate
}

// limits are the drain rate, bucket size and concurrency limit that s (nil: an absent key)
// is held to. In a shared budget they are its lease, or for an absent key the provisional
// lease, where zero means none rather than unlimited: the Spec says which limits are on.
func (k *keys) limits(s *state) (rate, burst float64, maxConcurrent int) {
	if !k.shared {
		return k.spec.Rate, k.spec.Burst, k.spec.MaxConcurrent
	}
	l := &k.provisional
	if s != nil && s.part != nil {
		l = &s.part.lease
	}
	return l.Rate, l.Burst, l.Slots
}

// emptyFits reports whether a key with credit (rate) and no debt may admit a statement
// larger than its bucket: a lease holds a fraction of the budget's burst, and a statement
// that fits the budget's must not be refused for ever. (A local bucket is the budget's.)
func emptyFits(debt, rate float64) bool {
	return rate > 0 && debt == 0
}

// retryAfter is when need fits s's bucket: exact for a local budget, and for a shared one
// while its lease holds. A key without credit is told the link's retry hint; a statement
// larger than the lease's bucket fits once the debt is gone (emptyFits).
func (b *Budget) retryAfter(bk Bucket, now time.Time, rate, burst, need float64) time.Duration {
	switch {
	case rate == 0:
		return b.link.retry
	case need > withSlack(burst):
		return bk.emptyAfter(now, rate)
	}
	return bk.RetryAfter(now, rate, burst, need)
}

// refused records, in a shared budget, a statement r refused for reason with slots taken by
// earlier requests of its admission: its demand counts. It returns the coordinator's kick,
// which the caller calls once b is unlocked; nil in a local budget. The caller holds b.mu.
func (b *Budget) refused(now time.Time, r *Request, reason string, slots int) (kick func()) {
	k := &b.keys
	if !k.shared || reason == vocab.ReasonPerQuery {
		return nil
	}
	s := k.lookup(r.Key)
	if s == nil {
		s = k.insert(r.Key, now) // a new partition: the kick below has it leased early
	}
	p := s.part
	p.offered += sanitizeCost(r.Cost)
	p.starved = true
	if reason == vocab.ReasonConcurrency {
		// Every statement refused since the last report wanted a slot beside those in
		// flight: a burst of N asks for N slots at once, not one more per sync. A caller
		// that retries counts again, so the count stops at the budget's own limit.
		p.queued++
		p.wanted = max(p.wanted, s.inflight+slots+p.queued)
		if m := k.spec.MaxConcurrent; m > 0 {
			p.wanted = min(p.wanted, m)
		}
	}
	return b.link.kick
}

// remove drops s, which has nothing in flight, from the table.
func (k *keys) remove(s *state) {
	if s == k.unkeyed {
		k.unkeyed = nil
		return
	}
	if s.idx >= 0 {
		heap.Remove(&k.idle, s.idx)
	}
	delete(k.byKey, s.key)
}
