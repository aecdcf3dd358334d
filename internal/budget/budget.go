package budget

import (
	"sync"
	"sync/atomic"
	"time"
)

// lastSeq numbers budgets in creation order; [Admit] locks budgets in this
// order so that two admissions over the same budgets cannot deadlock.
var lastSeq atomic.Uint64

// defaultHold is the concurrency RetryAfter hint before any query completed.
const defaultHold = 100 * time.Millisecond

// Budget is one configured budget: a reverse leaky bucket, a concurrency
// count and a per-query limit, kept per key (the value of the budget's `per`
// tag, or "" for all queries). It is changed only through [Admit] (which
// takes a slot and reserves debt) and [Release] or [Budget.Release] (which
// give both back, trued up to the actual cost).
//
// A Budget is safe for concurrent use; one mutex guards its state and the
// counters are atomics. Create one with [New]; the zero value is not usable.
type Budget struct {
	// The fields an admission and a release of the key "" touch are first and together: with
	// spec and tab's first fields they span three cache lines.
	mu       sync.Mutex // protects the fields below but the atomics and seq
	admitted uint64     // admissions
	inflight int        // summed over keys
	meanHold float64    // EMA of actual seconds per released query, for the concurrency hint
	epoch    time.Time  // the zero of the int64 clock: NewAt's, else the first now seen
	hasEpoch bool
	atEpoch  bool // epoch is NewAt's: AdmitAt may be used
	spec     Spec
	tab      table

	seq     uint64 // creation order, for lock ordering; immutable
	warned  atomic.Uint64
	blocked atomic.Uint64
	text    limitText
}

// New returns a budget with no debt and nothing in flight.
func New(spec Spec) *Budget {
	spec = spec.normalize()
	return &Budget{
		seq:  lastSeq.Add(1),
		spec: spec,
		text: newLimitText(spec),
		tab:  newTable(spec.Rate, spec.MaxKeys),
	}
}

// NewAt is [New] with the budget's clock starting at epoch, so that [AdmitAt]
// can be given times as nanoseconds since epoch, read once by a caller that
// keeps time that way (the engine), instead of a time.Time that each budget
// converts. Times before epoch are allowed (negative nanoseconds).
func NewAt(spec Spec, epoch time.Time) *Budget {
	b := New(spec)
	b.epoch, b.hasEpoch, b.atEpoch = epoch, true, true
	return b
}

// clock converts now to nanoseconds since the budget's epoch. Using Sub keeps
// the monotonic reading of time.Now, so a wall-clock step cannot drain or
// freeze buckets.
func (b *Budget) clock(now time.Time) int64 {
	if !b.hasEpoch {
		b.epoch, b.hasEpoch = now, true
	}
	return int64(now.Sub(b.epoch))
}

// instant is when an admission happens: a time.Time that each budget converts
// to its clock (Admit, Check), or nanoseconds since the common epoch of
// budgets made by NewAt (AdmitAt).
type instant struct {
	now   time.Time
	t     int64
	nanos bool
}

// at is w on b's clock. The caller holds b.mu (clock may set the epoch).
func (b *Budget) at(w *instant) int64 {
	if w.nanos && b.atEpoch {
		return w.t // AdmitAt's: inlined, no call
	}
	return b.atTime(w)
}

// atTime is at of a time.Time, or AdmitAt's misuse.
func (b *Budget) atTime(w *instant) int64 {
	if w.nanos {
		panic("budget: AdmitAt of a budget made without an epoch (use NewAt)")
	}
	return b.clock(w.now)
}

// Spec returns the budget's normalised spec.
func (b *Budget) Spec() Spec {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.spec
}

// SetSpec applies a reloaded spec at now, keeping each key's debt (drained
// at the old rate until now, at the new rate after) and in-flight count. A
// smaller MaxKeys evicts down to the new bound. O(number of keys).
func (b *Budget) SetSpec(now time.Time, spec Spec) {
	spec = spec.normalize()
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.clock(now)
	b.spec = spec
	b.text = newLimitText(spec)
	b.tab.setRate(t, spec.Rate) // leaves the heap exact, as a smaller maxKeys needs
	b.tab.maxKeys = spec.MaxKeys
	b.tab.trim()
}

// Release gives back the slot that an [Admit] took for key and trues the
// debt up by actual − reserved (a refund when the query was cheaper than
// predicted), never leaving it below zero. A Release with nothing in flight
// for key (never admitted, or released twice) changes nothing.
//
// The package-level [Release] does the same for an admitted [Request]
// without looking key up.
func (b *Budget) Release(now time.Time, key string, reserved, actual float64) {
	r := Request{Budget: b, Key: key, Cost: reserved} // no handle: releaseReq looks key up
	b.mu.Lock()
	b.releaseReq(b.clock(now), &r, actual)
	b.mu.Unlock()
}

// Release is [Budget.Release] of r.Budget for r.Key with r.Cost reserved,
// for a request that [Admit] admitted: Admit left in r a handle to the key's
// state, so that Release finds it without hashing the key. It is the same
// as r.Budget.Release(now, r.Key, r.Cost, actual) in every case, including a
// request that was never admitted or is released twice (nothing changes), or
// whose Budget or Key was changed since Admit (the handle is then ignored).
func Release(now time.Time, r *Request, actual float64) {
	b := r.Budget
	b.mu.Lock()
	b.releaseReq(b.clock(now), r, actual)
	b.mu.Unlock()
}

// ReleaseAfter is [Release] at d after the time r was admitted: for a
// caller that measured how long the query ran since its admission, it saves
// converting a time.Time to the budget's clock. r must be a request that
// [Admit] admitted (its admission time is kept in it); a request that was
// not is released at d after the budget's first use, which changes nothing
// when nothing is in flight for its key.
func ReleaseAfter(r *Request, d time.Duration, actual float64) {
	b := r.Budget
	b.mu.Lock()
	b.releaseReq(r.at+int64(d), r, actual)
	b.mu.Unlock()
}

// releaseReq releases r at t (b's clock): it gives back one slot of r's
// state, if one is in flight, and trues its debt up. The caller holds b.mu.
func (b *Budget) releaseReq(t int64, r *Request, actual float64) {
	s := r.st
	// The handle is only a hint: a copy of r may have been released before
	// (after which the state can be evicted and reused for another key), and
	// the caller may have changed r.Budget or r.Key. owns checks in O(1)
	// that s is still what the lookup would find; the key "" needs no hash
	// anyway.
	if s == nil || !b.tab.owns(s, r.Key) {
		s = b.tab.lookup(r.Key)
	}
	if s == nil || s.inflight == 0 {
		return
	}
	actual = sanitizeCost(actual)
	b.tab.charge(s, t, actual-sanitizeCost(r.Cost))
	s.inflight--
	b.inflight--
	if s.inflight == 0 && s != &b.tab.unkeyed {
		b.tab.reprio(s) // its priority falls from in-flight to emptyAt
		// The table outgrows its bound only while every state is in flight;
		// shrink back as soon as one is not. The unkeyed state is in no heap
		// and never evicted, so its release frees nothing to evict.
		b.tab.trim()
	}
	if b.meanHold == 0 {
		b.meanHold = actual
	} else {
		b.meanHold += 0.1 * (actual - b.meanHold)
	}
}

// concurrencyHint is how long a caller refused a slot might wait: the mean
// hold time spread over the slots, within [1ms, 1s]. Only a hint: slots free
// when queries finish, which nothing here can predict exactly.
func (b *Budget) concurrencyHint() time.Duration {
	d := defaultHold
	if b.meanHold > 0 {
		d = time.Duration(b.meanHold * 1e9 / float64(max(1, b.spec.MaxConcurrent)))
	}
	return min(max(d, time.Millisecond), time.Second)
}

// CountBlocked counts a denial decided outside [Admit] (a health threshold)
// in the budget's Blocked counter.
func (b *Budget) CountBlocked() { b.blocked.Add(1) }

// CountWarned counts a warning decided outside [Admit] (a health threshold
// of a warn budget) in the budget's Warned counter.
func (b *Budget) CountWarned() { b.warned.Add(1) }

// Snapshot is a budget's state at one instant, for introspection and gauges.
type Snapshot struct {
	Spec     Spec
	Debt     float64 // execution seconds, summed over keys, drained to the snapshot's time
	MaxDebt  float64 // the largest debt of one key
	InFlight int     // queries admitted and not yet released, summed over keys
	Keys     int     // per-key states held
	Admitted uint64  // admissions
	Warned   uint64  // admissions that carried a Warning for this budget
	Blocked  uint64  // denials by this budget (a caller that retries counts each try)
	Evicted  uint64  // key states evicted to make room
}

// Snapshot reports the budget at now. It costs O(number of keys) under the
// budget's lock: fine for a scrape, not for the hot path.
func (b *Budget) Snapshot(now time.Time) Snapshot {
	b.mu.Lock()
	t := b.clock(now)
	snap := Snapshot{
		Spec:     b.spec,
		InFlight: b.inflight,
		Keys:     b.tab.count(),
		Evicted:  b.tab.evicted,
	}
	add := func(s *state) {
		d := b.tab.debtAt(s, t)
		snap.Debt += d
		snap.MaxDebt = max(snap.MaxDebt, d)
	}
	if b.tab.hasUnkeyed {
		add(&b.tab.unkeyed)
	}
	for _, e := range b.tab.heap {
		add(e.s)
	}
	snap.Admitted = b.admitted
	b.mu.Unlock()
	snap.Warned = b.warned.Load()
	snap.Blocked = b.blocked.Load()
	return snap
}
