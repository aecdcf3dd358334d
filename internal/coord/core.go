package coord

import (
	"math"
	"slices"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/budget"
)

// leaseDuration is how long a lease lasts without renewal, on the instance and in Redis
// alike: a crashed instance's capacity returns after this long. Two and a half intervals
// outlast one missed renewal (renewals come every interval, see nextRegular) yet bring a
// crashed instance's capacity back within three intervals, as the instances that want it
// sync when it lapses (see part.retake).
func leaseDuration(interval time.Duration) time.Duration { return interval * 5 / 2 }

// sightings is how many of the latest live counts a partition keeps.
const sightings = 3

// expectWindow is how many intervals an instance remembers how many instances it saw.
const expectWindow = 10

// idleSyncs is how many syncs a partition is reported with no usage (nothing in flight or
// waiting either) before the instance leaves it (Redis forgets its entry at once and its
// slots return).
const idleSyncs = 2

// maxPartitionsPerCall bounds the partitions of one script call, so that one call cannot
// hold Redis for long; a sync of more active partitions makes several calls.
const maxPartitionsPerCall = 256

// part is one partition of a shared budget on this instance: its demand, its usage report,
// and its lease.
type part struct {
	key      string
	demand   estimator // offered execution seconds per second
	want     estimator // slots wanted at once
	offered  float64   // execution seconds offered since the last sync
	peak     int       // slots wanted at once since the last sync
	inflight int
	waiting  int       // statements waiting for the partition's room (max_wait), as last reported
	starved  bool      // refused or waited since the last sync
	local    float64   // the local bucket's debt as last taken, execution seconds
	localAt  time.Time // when
	active   bool      // reported since the last successful sync
	fresh    bool      // reported since the last sync attempt
	idle     int       // syncs in a row with no usage
	last     time.Time // when it was last reported: its demand is estimated over the time since
	// keep holds the partition while the budget is registered, idle or not: the unkeyed
	// partition of a budget, leased before its first statement (see core.keepUnkeyed).
	keep bool

	// The usage report: pending (seq > 0) is resent unchanged until Redis acknowledges it,
	// so a lost reply cannot count usage twice; acc collects the usage for the next one.
	// Each covers the usage since its from (see report.age).
	pendingSeq  uint64
	pendingUsed float64
	pendingFrom time.Time
	accUsed     float64
	accFrom     time.Time

	grant       budget.Lease // the last lease from Redis
	hasGrant    bool         // grant is set
	firstGrant  time.Time    // when the sync of the first grant was sent
	expires     time.Time    // when grant lapses: the sync's send time plus the lease duration
	target      float64      // the fair rate Redis computed for this instance
	targetSlots int
	asked       int                 // slots wanted as reported by the sync of grant
	inForce     Limits              // the limits Redis divided, as last seen
	differ      bool                // the instances in the partition disagree on the limits
	live        int                 // instances sharing the partition, as last seen
	debt        float64             // global debt as last seen, execution seconds
	seen        [sightings]sighting // the latest live counts, newest first
	// retake is when the partition syncs early for capacity to move: when another
	// instance's lease lapses, set while this partition is starved (it takes up the capacity
	// of an instance that crashed); at once, when Redis asks it to confirm a smaller grant;
	// or soon, when another instance wants slots this one holds (see wanted).
	retake time.Time
	// called says another instance wants slots this one holds (wanted): at the next report
	// the estimate of the slots it wants falls eight times as fast (see roll).
	called bool

	pushed    budget.Lease // what the local budget enforces
	hasPushed bool
	removed   bool // dropped from core.parts, not yet from core.order
}

// sighting is a live count seen in a reply.
type sighting struct {
	at   time.Time
	live int
}

// expected is the most instances seen in the partition lately (within window of now, or at
// any time while failing: those instances may be failing too). Redis uses it only when its
// state for the partition is gone, to keep the share of instances it lost free for them.
// Expecting too many costs little (that share stays free for a lease duration); too few
// could let the lost ones' share be used twice, so the window is generous.
func (p *part) expected(now time.Time, window time.Duration, failing bool) int {
	n := 0
	for _, s := range p.seen {
		if !s.at.IsZero() && (failing || now.Sub(s.at) < window) {
			n = max(n, s.live)
		}
	}
	return n
}

// short reports whether a starved partition may gain from an early sync: it holds less
// than its fair share (others have given capacity back), or it wants more slots at once
// than the sync that set its share knew of, and holds fewer than the budget's limit.
func (p *part) short(maxConcurrent int) bool {
	return p.grant.Rate < p.target*0.99 || p.grant.Slots < p.targetSlots ||
		p.peak > p.asked && p.grant.Slots < maxConcurrent
}

// core is the plain, single-threaded state of one shared budget on this instance: it turns
// usage into reports, replies into leases, and decides when to sync. Its zero value is not
// usable; build one with newCore. Time is always a parameter.
type core struct {
	spec      Spec
	interval  time.Duration
	fallbackN int // instances assumed before any was seen
	rand      func() float64

	parts map[string]*part
	// order holds the partitions in the order they came, and those removed since the last
	// sync (removed counts them). A sync goes round them in this order every time, so that
	// each partition is renewed a sync's length after its last renewal: in a map's order,
	// which differs each time, a partition first in one sync and last in the next would wait
	// up to two syncs' length, past its lease when a sync of many partitions takes longer
	// than an interval.
	order   []*part
	removed int
	// known is how many instances were last seen sharing the budget: the most live in one
	// partition at the last regular sync, or more since; 0 before any sync succeeded. round
	// is the most seen so far in the regular sync under way (with the early ones since). The
	// most in any one partition, not the last partition's count: the instances of a budget
	// per tenant share its unkeyed partition, while most tenants are seen by one of them.
	known    int
	round    int
	seq      uint64
	last     time.Time // last sync attempt
	next     time.Time // next regular sync
	dueAt    time.Time // when the regular sync being made was due: its place on the grid (nextRegular)
	failing  bool      // the last sync failed
	since    time.Time // when failing began
	streak   int       // syncs failed in a row (deadline)
	anyNew   bool      // a partition has no lease yet
	anyShort bool      // a starved partition may gain from an early sync (part.short)
	kicked   bool      // the local budget asked for an early sync since the last one
	partial  bool      // the sync being made is an early one, of the partitions that asked

	// Redis's clock as of the last reply, so that a call can tell Redis when it is too old
	// to act on: redisAt µs of Redis TIME at localAt on ours.
	redisAt int64
	localAt time.Time

	// publish are the quarantines this instance began, to publish at the next sync
	// (quarantine.go); ignored counts the quarantines read from Redis that were invalid.
	publish []Quarantined
	ignored uint64

	// Counters for status and metrics.
	syncs, failures uint64
	latency         time.Duration
	lastOK          time.Time
}

func newCore(spec Spec, interval time.Duration, fallbackN int, rand func() float64) *core {
	return &core{spec: spec.normalize(), interval: interval, fallbackN: max(fallbackN, 1), rand: rand,
		parts: map[string]*part{}}
}

// instances is the instance count fallback leases divide by.
func (c *core) instances() int {
	if c.known > 0 {
		return c.known
	}
	return c.fallbackN
}

// absorb takes a local usage report made at now. It only accumulates: demand is estimated
// per sync, over windows long enough to mean something.
func (c *core) absorb(now time.Time, usage []budget.Usage) {
	for i := range usage {
		u := &usage[i]
		if !active(u) {
			continue
		}
		p := c.parts[u.Key]
		if p == nil {
			p = c.add(&part{key: u.Key, accFrom: now})
		}
		if u.Offered > 0 && !math.IsInf(u.Offered, 1) {
			p.offered += u.Offered
		}
		p.peak = max(p.peak, u.Wanted, u.InFlight)
		p.inflight = max(u.InFlight, 0)
		p.waiting = max(u.Waiting, 0)
		if u.Debt >= 0 && !math.IsInf(u.Debt, 1) {
			p.local, p.localAt = u.Debt, now
		}
		p.fresh = true
		if u.Provisional && p.hasGrant {
			p.hasPushed = false // the budget lost the lease (it evicted the key): hand it over again
		}
		p.starved = p.starved || u.Starved
		p.active = true
		if u.Used > 0 && !math.IsInf(u.Used, 1) {
			p.accUsed += u.Used
		}
	}
	c.anyNew, c.anyShort = false, false
	for _, p := range c.parts {
		c.anyNew = c.anyNew || !p.hasGrant
		c.anyShort = c.anyShort || p.starved && p.short(c.spec.MaxConcurrent)
	}
}

// Early syncs come at least this long after the last sync: soon for a partition with no
// lease, later for one starved below its fair share. The bounds keep Redis calls few.
func newGap(interval time.Duration) time.Duration   { return min(interval/10, 100*time.Millisecond) }
func shortGap(interval time.Duration) time.Duration { return min(interval/8, 125*time.Millisecond) }

// due reports whether to sync at now. Besides the regular sync, a kicked budget (the local
// budget refused or made wait a statement, or met a new partition) syncs early. A failing
// budget does not sync early: it waits for its jittered retry.
func (c *core) due(now time.Time, kicked bool) bool {
	c.kicked = c.kicked || kicked
	if !now.Before(c.next) || c.retakeDue(now) {
		return true
	}
	if at, ok := c.early(); ok {
		return !now.Before(at)
	}
	return false
}

// wanted marks the partition whose field is field, if this instance holds slots of it, to
// sync early: another instance said on the budget's want channel that it wants more than it
// was granted while others hold slots beyond their targets. Redis decides at that sync what
// this instance hands back, from an estimate of the slots it wants that falls faster meanwhile
// (see roll). The sync comes an eighth of an interval after the last at the soonest, as a
// starved partition's does, whatever the messages (they are untrusted input). It reports
// whether it marked one.
func (c *core) wanted(now time.Time, field string) bool {
	p := c.parts[field]
	if p == nil || partitionField(p.key) != field || !p.hasGrant || p.grant.Slots == 0 {
		return false
	}
	at := c.last.Add(shortGap(c.interval))
	if at.Before(now) {
		at = now
	}
	if p.retake.IsZero() || at.Before(p.retake) {
		p.retake = at
	}
	p.called = true
	return true
}

// regular reports whether the regular sync, of every partition, is due at now.
func (c *core) regular(now time.Time) bool { return !now.Before(c.next) }

// retakeDue reports whether a starved partition waits for a lease that has lapsed by now.
func (c *core) retakeDue(now time.Time) bool {
	if c.failing {
		return false
	}
	for _, p := range c.parts {
		if !p.retake.IsZero() && !now.Before(p.retake) {
			return true
		}
	}
	return false
}

// early is when an early sync may come, if one is wanted.
func (c *core) early() (time.Time, bool) {
	if c.failing || !c.kicked {
		return time.Time{}, false
	}
	switch {
	case c.anyNew || len(c.publish) > 0:
		return c.last.Add(newGap(c.interval)), true
	case c.anyShort:
		return c.last.Add(shortGap(c.interval)), true
	}
	return time.Time{}, false
}

// nextWake is when the loop must look at this budget again: its regular sync, an early one,
// or sooner while a lease decays or lapses.
func (c *core) nextWake(now time.Time) time.Time {
	w := c.next
	if at, ok := c.early(); ok {
		w = minTime(w, at)
	}
	if c.failing {
		w = minTime(w, now.Add(c.interval/4))
	}
	for _, p := range c.parts {
		if p.hasGrant && p.expires.After(now) {
			w = minTime(w, p.expires)
		}
		if !p.retake.IsZero() && !c.failing {
			w = minTime(w, p.retake)
		}
	}
	return w
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// report is one partition's entry in a sync.
type report struct {
	p    *part
	seq  uint64
	used float64
	// age is how long before now the report's usage counts as run: in the middle of the
	// interval it covers (since pendingFrom), or of the first interval when syncs failed
	// for longer, as if it had come on time (see dueAfter); Redis counts it there where the
	// budget's global bucket was idle since (see sync.lua). Counted as run when it arrives,
	// the usage of an outage would fill every instance's bucket with its debt share after it.
	age time.Duration
	// held is what the local bucket holds of the global debt: its own debt, drained at its
	// lease's rate since it was taken.
	held     float64
	demand   float64
	want     int
	applied  int
	inflight int
	leave    bool
	expected int // instances seen lately; see part.expected
	// recovering says that the previous sync failed: Redis keeps the capacity of the
	// instances it lost free for them (see sync.lua).
	recovering bool
}

// reports builds the partitions' entries of a regular sync at now, in chunks of at most
// maxPartitionsPerCall: every partition. A partition idle for idleSyncs syncs is left. A
// budget with shared quarantines syncs even with no partition to report: its one chunk is
// then empty.
func (c *core) reports(now time.Time) [][]report { return c.build(now, false) }

// earlyReports builds the entries of an early sync at now: only the partitions that asked for
// it (wantsEarly). A budget of a hundred thousand tenants must not sync them all each time a
// new tenant appears, or a starved one asks.
func (c *core) earlyReports(now time.Time) [][]report { return c.build(now, true) }

// wantsEarly reports whether p takes part in an early sync at now: it has no lease yet, it is
// starved and may gain (part.short), another instance's lease it waits for has lapsed, or
// Redis asked it to confirm a smaller grant (see retake).
func (c *core) wantsEarly(p *part, now time.Time) bool {
	return !p.hasGrant || p.starved && p.short(c.spec.MaxConcurrent) || !p.retake.IsZero() && !now.Before(p.retake)
}

func (c *core) build(now time.Time, early bool) [][]report {
	c.last, c.kicked, c.partial = now, false, early
	if !early {
		// A regular sync made before it was due (Coordinator.Sync) starts the grid again from now.
		c.dueAt = c.next
		if c.next.After(now) {
			c.dueAt = now
		}
	}
	if !early {
		if c.round > 0 {
			c.known = c.round
		}
		c.round = 0
	}
	if c.removed > 0 {
		c.order = slices.DeleteFunc(c.order, func(p *part) bool { return p.removed })
		c.removed = 0
	}
	prov := c.provisional()
	var out [][]report
	var cur []report
	for _, p := range c.order {
		if early && !c.wantsEarly(p, now) {
			continue
		}
		c.roll(p, now)
		if cur == nil && !early {
			// Sized for the chunk: grown report by report, a regular sync of a hundred
			// thousand partitions would copy its reports about twice over. An early sync
			// carries the few partitions that asked, and grows its chunk as it goes.
			cur = make([]report, 0, min(maxPartitionsPerCall, len(c.order)))
		}
		// The lease the local budget holds the partition to: the last handed over, else the
		// provisional one (Redis counts its slots as held until a smaller grant is applied).
		applied := p.pushed
		if !p.hasPushed {
			applied = prov
		}
		cur = append(cur, report{
			p: p, seq: p.pendingSeq, used: p.pendingUsed, age: max(0, now.Sub(p.pendingFrom)-c.dueAfter(p, now)),
			held:   max(0, p.local-applied.Rate*now.Sub(p.localAt).Seconds()),
			demand: p.demand.v, want: p.want.slots(),
			applied: applied.Slots, inflight: c.held(p.inflight, applied),
			leave:    p.idle > idleSyncs && p.inflight == 0 && p.waiting == 0 && !p.keep,
			expected: p.expected(now, expectWindow*c.interval, c.failing), recovering: c.failing,
		})
		if len(cur) == maxPartitionsPerCall {
			out, cur = append(out, cur), nil
		}
	}
	if len(cur) > 0 || len(out) == 0 && c.spec.Quarantine != (QuarantineSpec{}) && (!early || len(c.publish) > 0) {
		out = append(out, cur)
	}
	return out
}

// held is what a partition with inflight statements in flight under its applied lease holds
// of the budget's slots: all of them, which Redis counts as held beyond the lease while they
// run from an earlier, larger one; but in warn mode (Spec.Warn) at most the lease's, those
// beyond it running where enforce would have had them wait.
func (c *core) held(inflight int, applied budget.Lease) int {
	if c.spec.Warn {
		return min(inflight, applied.Slots)
	}
	return inflight
}

// roll closes p's interval at now, as a sync reports it: its idle count, its demand and slot
// estimates from what the interval offered and wanted, and the sequence number of its usage
// report (a new one unless the last is still unanswered).
func (c *core) roll(p *part, now time.Time) {
	dt := c.interval
	if !p.last.IsZero() && now.After(p.last) {
		dt = now.Sub(p.last)
	}
	p.last = now
	if p.active {
		p.idle = 0
	} else {
		p.idle++
	}
	if !p.fresh {
		p.inflight, p.waiting = 0, 0 // a partition with statements in flight or waiting reports them
	}
	p.fresh = false
	p.demand.add(p.offered/dt.Seconds(), dt, c.interval)
	if p.called {
		// Another instance is kept short: a demand that stopped must not hold its slots
		// for the intervals of the estimate's slow fall, so it halves the gap each eighth of
		// an interval. Not at once: a bursty instance would give its slots away between its
		// bursts and call for them back at the next (see estimator).
		p.want.add(float64(p.peak), dt, shortGap(c.interval))
		p.called = false
	} else {
		p.want.add(float64(p.peak), dt, c.interval)
	}
	p.offered, p.peak = 0, 0
	if p.pendingSeq == 0 {
		c.seq++
		p.pendingSeq, p.pendingUsed, p.accUsed = c.seq, p.accUsed, 0
		p.pendingFrom, p.accFrom = p.accFrom, now
	}
}

// keepUnkeyed makes the unkeyed partition ("") known before any statement and keeps it while
// the budget is registered: a budget without a per tag has only that partition, and its first
// sync, made at once, leases it before its first statement (one instance alone holds the
// whole budget), rather than after it was refused for want of a lease. Idle, it still renews
// its lease (one call per interval), so that a burst after a quiet spell finds its headroom.
func (c *core) keepUnkeyed(now time.Time) {
	if c.parts[""] == nil {
		c.add(&part{key: "", accFrom: now, keep: true})
		c.anyNew = true
	}
}

// add adds the new partition p and returns it.
func (c *core) add(p *part) *part {
	c.parts[p.key] = p
	c.order = append(c.order, p)
	return p
}

// remove removes partition p; the next sync drops it from c.order.
func (c *core) remove(p *part) {
	delete(c.parts, p.key)
	p.removed = true
	c.removed++
}

// youngLease is how long a partition's reports count their usage as run when they arrive,
// from its first lease: a cold start's usage is the debt that must not be offered again.
const youngLease = 3

// dueAfter is how long after its usage began a report of p made at now is due; a later report
// counts its usage as run that much later than it began (see report.age). Half an interval:
// in the middle of the interval it covers; a whole one, as run when it arrives, while p's
// lease is young (a cold start) or p has none.
func (c *core) dueAfter(p *part, now time.Time) time.Duration {
	if !p.hasGrant || now.Sub(p.firstGrant) < youngLease*c.interval {
		return c.interval
	}
	return c.interval / 2
}

// result is Redis's answer for one partition.
type result struct {
	lease       budget.Lease
	live        int
	debt        float64
	target      float64
	targetSlots int
	retake      time.Duration // until another instance's lease lapses, if starved; 0: none
	inForce     Limits        // the smallest limits of the instances in the partition
	differ      bool          // the instances disagree on the limits
	hold        float64       // the debt the local bucket must hold from now on (sync.lua)
}

// notAfter is the Redis time after which a call sent at now with deadline d must not act:
// Redis's clock as of the last reply, advanced by our own since, plus twice the deadline
// for the round trip. 0 (no limit) before any reply.
func (c *core) notAfter(now time.Time, d time.Duration) int64 {
	if c.localAt.IsZero() {
		return 0
	}
	return c.redisAt + (now.Sub(c.localAt) + 2*d).Microseconds()
}

// clock records Redis's time from a reply received at now.
func (c *core) clock(redisNow int64, now time.Time) {
	if redisNow > 0 {
		c.redisAt, c.localAt = redisNow, now
	}
}

// failed records a sync begun at sent that failed at now: leases are kept (and decay once
// they lapse), reports stay pending, and the retry comes after a random delay so that
// instances do not all return to a recovered Redis at once — but, once, early enough to
// renew a lease in force before it lapses, so that one failed sync never lapses a lease.
func (c *core) failed(sent, now time.Time) {
	c.failures++
	c.streak++
	if !c.failing {
		c.failing, c.since = true, now
	}
	c.next = sent.Add(time.Duration(float64(c.interval) * (0.5 + c.rand())))
	for _, p := range c.parts {
		// Sent a deadline before the lease lapses, the retry ends before the lease does.
		if at := p.expires.Add(-c.deadline()); p.hasGrant && at.After(now) {
			c.next = minTime(c.next, at)
		}
	}
}

// deadline is how long each script call of the next sync may take, its turn among the calls
// on their way included: a quarter interval (at least minDeadline), so that a budget of many
// partitions syncs against a healthy Redis and a hung one fails a call well within a lease;
// after a failed sync twice that, and after two or more four times that (an interval at the
// default one), until a sync succeeds; and four times that until the coordinator's first sync
// succeeds. A call after a failure, and the first call, run on a new connection (go-redis
// closes one whose call timed out), whose handshake, HELLO and, where Redis lost the script,
// EVAL after EVALSHA, costs round trips within the call's deadline: with the same deadline for
// it, a Redis more than a third or half of a deadline away would fail a fresh instance's first
// call (its budgets on their fallback shares until a retry, "Redis unreachable" logged at every
// start) and every call after a failure, and its budgets would stay on their fallback shares
// for good. Until its first sync an instance runs on provisional leases whatever the deadline.
func (c *core) deadline() time.Duration {
	steps := min(c.streak, 2)
	if c.syncs == 0 {
		steps = 2
	}
	return callDeadline(c.interval) << steps
}

// applied records the answers to a chunk of reports sent at sent and received at now. It
// returns the partitions it dropped (left, or Redis answered for no one).
func (c *core) applied(sent, now time.Time, reps []report, res []result) (dropped []string) {
	c.syncs++
	if c.failing {
		// While we could not reach Redis, neither perhaps could the others: give those seen
		// before a lease duration from now to come back before no longer expecting them.
		for _, p := range c.parts {
			for i := range p.seen {
				if !p.seen[i].at.IsZero() {
					p.seen[i].at = now
				}
			}
		}
	}
	c.failing, c.streak = false, 0
	c.lastOK = now
	c.latency = now.Sub(sent)
	if !c.partial {
		c.next = c.nextRegular()
	}
	for i := range reps {
		c.round = max(c.round, res[i].live)
	}
	c.known = max(c.known, c.round)
	for i, rep := range reps {
		p, r := rep.p, res[i]
		p.pendingSeq, p.pendingUsed = 0, 0
		if rep.leave {
			c.remove(p)
			dropped = append(dropped, p.key)
			continue
		}
		if !p.hasGrant {
			p.firstGrant = sent
		}
		p.grant, p.hasGrant = r.lease, true
		if sent.Sub(p.firstGrant) < c.interval {
			// The first leases of a partition may come before the instances starting beside
			// this one have synced, or shown their demand (their first statements are
			// predicted at about nothing until one has run): alone, or asking for the
			// most, it would be granted the whole burst and use it before the others
			// share. For its first interval its burst is that of the instances assumed
			// before any were seen.
			p.grant.Burst = min(p.grant.Burst, c.spec.Burst/float64(c.fallbackN))
		}
		// The local bucket holds at least its own debt and the lease's share of the global
		// debt that no instance's bucket holds, so that a burst that moved here from another
		// instance, which used it, is not room twice (see sync.lua). At most a full bucket:
		// a debt past it would stop the instances for longer than a burst takes to drain.
		p.grant.Debt = min(r.hold, p.grant.Burst)
		copy(p.seen[1:], p.seen[:])
		p.seen[0] = sighting{now, r.live}
		p.expires = sent.Add(leaseDuration(c.interval))
		p.retake = time.Time{}
		if r.retake > 0 {
			// Measured from the reply, so never before Redis drops the lapsed lease.
			p.retake = now.Add(r.retake)
		}
		p.target, p.targetSlots, p.live, p.debt = r.target, r.targetSlots, r.live, r.debt
		p.asked = rep.want
		p.inForce, p.differ = r.inForce, r.differ
		p.active, p.starved = false, false
	}
	return dropped
}

// lease is the partition's lease in force at now: its grant until it lapses (Redis counts
// it as long), then the budget divided by the instances last seen in the partition: at once
// when the grant was larger, as Redis no longer counts it, and rising to it from a smaller
// grant. A partition without a grant has the provisional lease.
func (c *core) lease(p *part, now time.Time) budget.Lease {
	if !p.hasGrant {
		return c.provisional()
	}
	if now.Before(p.expires) {
		return p.grant
	}
	n := c.instances()
	if p.live > 0 {
		n = p.live
	}
	fb := fallbackLease(c.spec, n)
	return decay(capLease(p.grant, fb), fb, p.expires, now, c.interval)
}

// provisional is the lease of a partition this instance has no grant for (new to it, or back
// after it left it), which the local budget holds it to until the first grant, with no call
// on the statement's path: what Redis would grant it were no instance asking for any of the
// partition, the budget divided by the instances last seen sharing it (fallbackN before any
// sync answered), at least one slot. Alone, an instance holds the whole budget's slots and
// rate. Its burst is at most a first interval's (see applied), and none before any sync
// answered or while syncs fail: this instance cannot know then how many others start
// beside it, each with a fresh bucket (it admits one statement at a time, each once the
// last one's cost has drained). Redis counts nothing of it until the partition's first sync
// reports its statements; see the package documentation, "Provisional leases".
func (c *core) provisional() budget.Lease {
	l := fallbackLease(c.spec, c.instances())
	if c.known == 0 || c.failing {
		l.Burst = 0
	} else {
		l.Burst = min(l.Burst, c.spec.Burst/float64(c.fallbackN))
	}
	return l
}

// push is a lease to hand to the local budget.
type push struct {
	key   string
	lease budget.Lease
}

// pushes returns the leases that changed since they were last handed over.
func (c *core) pushes(now time.Time) []push {
	var out []push
	for _, p := range c.parts {
		out = c.push(out, p, now)
	}
	return out
}

// pushesOf is pushes of the partitions of reps, a chunk whose reply was just applied (those
// it dropped are gone).
func (c *core) pushesOf(reps []report, now time.Time) []push {
	var out []push
	for _, rep := range reps {
		if !rep.p.removed {
			out = c.push(out, rep.p, now)
		}
	}
	return out
}

// push appends p's lease at now to out if it changed since it was last handed over. A
// partition with no grant yet is left on the lease the local budget gave it (provisional, or
// its own limits kept since it became shared) while Redis answers: its grant is a sync away.
func (c *core) push(out []push, p *part, now time.Time) []push {
	if !p.hasGrant && !c.failing {
		return out
	}
	l := c.lease(p, now)
	if p.hasPushed && l == p.pushed {
		return out
	}
	p.pushed, p.hasPushed = l, true
	return append(out, push{p.key, l})
}

// Limits are a shared budget's global limits as Redis divides them.
type Limits struct {
	Rate          float64 // execution seconds per second; 0: no bucket
	Burst         float64 // execution seconds
	MaxConcurrent int     // 0: unlimited
}

// Status is one shared budget as this instance sees it.
type Status struct {
	Name       string
	Partitions int           // partitions this instance takes part in
	Rate       float64       // local leases, summed over partitions
	Burst      float64       // summed over partitions
	Slots      int           // summed over partitions
	GlobalDebt float64       // execution seconds, summed over partitions, as last seen
	Instances  int           // instances sharing the budget, as last seen (0: never seen)
	Fallback   bool          // the last sync failed: leases are kept or decaying
	Syncs      uint64        // successful syncs
	Failures   uint64        // failed syncs
	Latency    time.Duration // of the last successful sync
	LastSync   time.Time     // of the last successful sync
	// Ignored counts the entries read from Redis that this instance ignored as invalid
	// (shared quarantines: not a fingerprint, no time left, past MaxQuarantines).
	Ignored uint64
	// LimitsDiffer says that the instances sharing the budget disagree on its limits (a
	// change of the rules half rolled out); LimitsInForce is then the smallest limits any
	// of them holds, which every instance divides until they agree. Both as last seen.
	LimitsDiffer  bool
	LimitsInForce Limits
}

func (c *core) status(now time.Time) Status {
	s := Status{Name: c.spec.Name, Partitions: len(c.parts), Instances: c.known, Fallback: c.failing,
		Syncs: c.syncs, Failures: c.failures, Latency: c.latency, LastSync: c.lastOK, Ignored: c.ignored}
	s.LimitsInForce = Limits{Rate: c.spec.Rate, Burst: c.spec.Burst, MaxConcurrent: c.spec.MaxConcurrent}
	for _, p := range c.parts {
		if p.differ {
			in := &s.LimitsInForce
			s.LimitsDiffer = true
			in.Rate, in.Burst = min(in.Rate, p.inForce.Rate), min(in.Burst, p.inForce.Burst)
			in.MaxConcurrent = min(in.MaxConcurrent, p.inForce.MaxConcurrent)
		}
		l := c.lease(p, now)
		s.Rate += l.Rate
		s.Burst += l.Burst
		s.Slots += l.Slots
		s.GlobalDebt += p.debt
	}
	return s
}

// nothingToSync records a due sync with no partition to report: nothing to ask Redis.
func (c *core) nothingToSync(now time.Time) {
	c.last = now
	if !c.partial {
		c.next = c.nextRegular()
	}
}

// nextRegular is when the regular sync after the one being made is due: an interval after
// this one was due, not after it began, so that each partition is renewed every interval,
// or every sync's length when a sync of many calls takes longer (the next then follows at
// once; a schedule counted from each sync's start would renew every sum of the two and lapse
// the leases of its first calls). Each instance keeps a grid of its own, whose phase it draws
// at its first regular sync (the next comes at a random point of the interval after it) and
// again after a failure (see failed): instances started or recovered together do not sync
// together. Syncs jittered each time instead would renew a partition up to the jitter late
// at every sync, and still let two instances wander into step. When a sync began more than
// an interval late (the last took that much longer than an interval), the grid starts again
// from it rather than catching up with syncs back to back.
func (c *core) nextRegular() time.Time {
	if c.dueAt.IsZero() {
		return c.last.Add(time.Duration(float64(c.interval) * c.rand()))
	}
	if next := c.dueAt.Add(c.interval); next.After(c.last) {
		return next
	}
	return c.last
}

// leaveAll builds reports that leave every partition, for a coordinator that closes.
func (c *core) leaveAll(now time.Time) [][]report {
	for _, p := range c.parts {
		p.idle = idleSyncs + 1
		p.active, p.inflight, p.waiting = false, 0, 0
	}
	reps := c.reports(now)
	for _, chunk := range reps {
		for i := range chunk {
			chunk[i].leave = true
		}
	}
	return reps
}
