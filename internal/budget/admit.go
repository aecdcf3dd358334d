package budget

import (
	"math"
	"time"
)

// maxCost caps costs so that an infinite prediction stays finite arithmetic
// (about 31 years of execution; it still exceeds any sane limit).
const maxCost = 1e9

// sanitizeCost maps NaN and negative costs to 0 and caps huge ones.
func sanitizeCost(c float64) float64 {
	if !(c > 0) {
		return 0
	}
	return min(c, maxCost)
}

// Request is one budget's part of an admission.
type Request struct {
	Budget *Budget // must not be nil
	Key    string  // the value of the budget's `per` tag; "" when it has none
	Cost   float64 // predicted execution seconds
	// WarnOnly marks a budget in warn mode: a limit it exceeds does not deny
	// the admission; the request is admitted anyway (its slot and debt
	// counted, so the budget keeps measuring) and reported as a [Warning]
	// with Over set.
	WarnOnly bool

	// st is the state that Admit charged for this request, set when it
	// admits, so that [Release] can skip the key lookup. Only a hint, checked
	// before use: see Release.
	st *state
	// at is when Admit admitted the request, on its budget's clock, for
	// [ReleaseAfter].
	at int64
}

// Denial says which request refused an admission and why.
type Denial struct {
	Index  int    // into the requests passed to Admit
	Reason string // ReasonConcurrency, ReasonPerQuery or ReasonBudget
	// RetryAfter is how long to wait before the request could be admitted.
	// For ReasonBudget it is exact: a retry at now+RetryAfter fits, absent
	// other traffic, and one nanosecond earlier does not. For
	// ReasonConcurrency it is a hint (mean hold time over the slots, within
	// [1ms, 1s]). For ReasonPerQuery it is 0: the query never fits.
	RetryAfter time.Duration
	// Limit names the limit, e.g. "max_concurrent=4", "burst_limit=10s".
	Limit string
}

// Warning reports a request whose budget is close to, or past, a limit after
// the admission.
type Warning struct {
	Index  int     // into the requests passed to Admit
	Reason string  // the fullest limit: ReasonConcurrency, ReasonPerQuery or ReasonBudget
	Fill   float64 // usage / limit after admission, e.g. 0.85
	Over   bool    // Fill > 1: a WarnOnly request admitted past its limit
	Limit  string  // as in Denial
}

// Admit decides, at now, whether every request admits, and only if all do
// takes a concurrency slot and reserves Cost of debt in each (all-or-nothing:
// a denial anywhere leaves every budget untouched). Each admitted request
// must later be given back, either with [Release] of the request (cheaper:
// on success Admit stores in each element of reqs a handle for it, so reqs
// must not be shared by concurrent calls) or with [Budget.Release] with the
// same key and cost.
//
// On success it returns warns with a [Warning] appended for each request
// whose limit is at or above its WarningThreshold, or past it (WarnOnly);
// pass a reused slice to avoid allocating. On refusal it returns the denial:
// one that can never fit (ReasonPerQuery) if any, else the one with the
// longest RetryAfter, since the caller must wait for all of them.
//
// A request whose Cost exceeds its budget's Burst can never fit either; it is
// denied with ReasonPerQuery and Limit naming burst_limit, rather than
// ReasonBudget with a RetryAfter that waiting could never honour.
//
// The same budget may appear in several requests; for the same key their
// slots and costs add up. Budgets are locked in creation order.
func Admit(now time.Time, reqs []Request, warns []Warning) ([]Warning, *Denial) {
	w := instant{now: now}
	if len(reqs) == 1 {
		return admitOne(&w, &reqs[0], warns)
	}
	return admitMany(&w, reqs, warns)
}

// AdmitAt is [Admit] at t nanoseconds since the epoch that every request's
// budget was made with by [NewAt] (the budgets must share it). It panics for
// a budget made by [New]. A caller that keeps time as such nanoseconds saves
// each budget's conversion of a time.Time.
func AdmitAt(t int64, reqs []Request, warns []Warning) ([]Warning, *Denial) {
	w := instant{t: t, nanos: true}
	if len(reqs) == 1 {
		return admitOne(&w, &reqs[0], warns)
	}
	return admitMany(&w, reqs, warns)
}

// admitMany is Admit of any number of requests. It is apart from Admit so
// that admitOne does not pay for its buffers.
func admitMany(w *instant, reqs []Request, warns []Warning) ([]Warning, *Denial) {
	var buf [8]*Budget
	locked := lockAll(buf[:0], reqs)
	defer unlockAll(locked)

	var pbuf [8]pending
	plan := prepare(w, reqs, pbuf[:0])
	if d, ok := check(reqs, plan, true); !ok {
		return warns, escape(d)
	}
	for i := range reqs {
		r, p := &reqs[i], &plan[i]
		s := p.s
		if p.shared {
			// An earlier request of this admission, applied just now, may
			// have inserted this key's state, or evicted and reused the one
			// prepare found for its own key: look it up again.
			s = r.Budget.tab.lookup(r.Key)
		}
		warns, r.st = apply(r.Budget, r, i, s, p.t, warns)
		r.at = p.t
	}
	return warns, nil
}

// pending is what an admission of several requests learns of one of them
// before checking, for both the check and the charge.
type pending struct {
	t      int64  // now on the budget's clock
	s      *state // the key's state before any request is applied; nil if none
	shared bool   // an earlier request of the admission has the same budget
}

// prepare appends to plan a pending for each request, with the budgets
// locked: now is converted once per budget, and each key looked up once.
// plan on the caller's stack holds 8 requests without allocating.
func prepare(w *instant, reqs []Request, plan []pending) []pending {
	for i := range reqs {
		r := &reqs[i]
		b := r.Budget
		p := pending{s: b.tab.lookup(r.Key)}
		for j := range i {
			if reqs[j].Budget == b {
				p.t, p.shared = plan[j].t, true
				break
			}
		}
		if !p.shared {
			p.t = b.at(w)
		}
		plan = append(plan, p)
	}
	return plan
}

// admitOne is Admit of one request, the common case: one lock taken
// directly, no earlier requests to count, and now converted and the key
// looked up once for both the check and the charge.
func admitOne(w *instant, r *Request, warns []Warning) ([]Warning, *Denial) {
	b := r.Budget
	b.mu.Lock()
	t := b.at(w)
	s := b.tab.lookup(r.Key)
	if sp := &b.spec; s != nil && !r.WarnOnly && !(sp.WarningThreshold > 0) {
		// The common admission (an enforced request for a key already held, no warning
		// threshold) that fits, fused: fits and apply, with the key's debt drained once for
		// both, equal to them in every result to the bit (TestAdmitOneMatchesMany). A request
		// that does not fit falls through to the general path, which works out the denial.
		cost, tb := sanitizeCost(r.Cost), &b.tab
		debt := tb.debtAt(s, t)
		if !(sp.PerQueryLimit > 0 && cost > sp.PerQueryLimit) &&
			!(sp.MaxConcurrent > 0 && int(s.inflight) >= sp.MaxConcurrent) &&
			!(sp.Rate > 0 && debt+cost > withSlack(sp.Burst)) {
			if tb.rate != 0 { // charge, as apply does: drain to t, add cost
				s.debt = debt + cost
				if !(s.debt > 0) {
					s.debt = 0
				}
				s.last = max(s.last, t)
			}
			s.inflight++
			b.inflight++
			if s.inflight == 1 && s != &tb.unkeyed {
				tb.reprio(s)
			}
			b.admitted++
			r.st, r.at = s, t
			b.mu.Unlock()
			return warns, nil
		}
	}
	if !r.WarnOnly && !b.fits(s, t, sanitizeCost(r.Cost)) {
		d, _ := checkOne(b, r, 0, s, t, 0, 0) // the denial, worked out only for a refusal
		b.blocked.Add(1)
		b.mu.Unlock()
		return warns, escape(d)
	}
	warns, r.st = apply(b, r, 0, s, t, warns)
	r.at = t
	b.mu.Unlock()
	return warns, nil
}

// Check is Admit without taking anything: the denial Admit would return now,
// or nil. It counts nothing.
func Check(now time.Time, reqs []Request) *Denial {
	if len(reqs) == 1 {
		return checkSingle(now, &reqs[0])
	}
	return checkMany(now, reqs)
}

// checkSingle is Check of one request; see admitOne.
func checkSingle(now time.Time, r *Request) *Denial {
	if r.WarnOnly {
		return nil
	}
	b := r.Budget
	b.mu.Lock()
	d, ok := checkOne(b, r, 0, b.tab.lookup(r.Key), b.clock(now), 0, 0)
	b.mu.Unlock()
	if !ok {
		return escape(d)
	}
	return nil
}

// checkMany is Check of any number of requests.
func checkMany(now time.Time, reqs []Request) *Denial {
	var buf [8]*Budget
	locked := lockAll(buf[:0], reqs)
	defer unlockAll(locked)
	var pbuf [8]pending
	if d, ok := check(reqs, prepare(&instant{now: now}, reqs, pbuf[:0]), false); !ok {
		return escape(d)
	}
	return nil
}

// escape moves a denial to the heap. Taking &d in the caller instead would
// heap-allocate d on every call, admitted or not.
//
//go:noinline
func escape(d Denial) *Denial { return &d }

// lockAll locks each distinct budget once, in creation order, and returns
// them for unlockAll. Requests are few, so an insertion sort into buf (on the
// caller's stack) beats anything cleverer.
func lockAll(buf []*Budget, reqs []Request) []*Budget {
	for _, r := range reqs {
		b := r.Budget
		i := len(buf)
		for i > 0 && buf[i-1].seq > b.seq {
			i--
		}
		if i > 0 && buf[i-1] == b {
			continue
		}
		buf = append(buf, nil)
		copy(buf[i+1:], buf[i:])
		buf[i] = b
	}
	for _, b := range buf {
		b.mu.Lock()
	}
	return buf
}

func unlockAll(locked []*Budget) {
	for i := len(locked) - 1; i >= 0; i-- {
		locked[i].mu.Unlock()
	}
}

// check runs every request's limits with the budgets locked and changes no
// state; plan is from prepare. It returns the denial to report and false if
// any enforced request fails; count adds each failing budget's Blocked
// counter.
func check(reqs []Request, plan []pending, count bool) (Denial, bool) {
	var worst Denial
	denied := false
	for i := range reqs {
		r := &reqs[i]
		if r.WarnOnly {
			continue
		}
		// Count the slots and costs of earlier requests for the same budget
		// and key as already taken.
		extraSlots, extraCost := 0, 0.0
		for _, o := range reqs[:i] {
			if o.Budget == r.Budget && o.Key == r.Key {
				extraSlots++
				extraCost += sanitizeCost(o.Cost)
			}
		}
		b := r.Budget
		d, ok := checkOne(b, r, i, plan[i].s, plan[i].t, extraSlots, extraCost)
		if ok {
			continue
		}
		if count {
			b.blocked.Add(1)
		}
		if !denied || worse(d, worst) {
			worst, denied = d, true
		}
	}
	return worst, !denied
}

// worse reports whether a should be reported instead of b: a refusal that
// never fits first, then the longest wait.
func worse(a, b Denial) bool {
	aNever, bNever := a.Reason == ReasonPerQuery, b.Reason == ReasonPerQuery
	if aNever != bNever {
		return aNever
	}
	return a.RetryAfter > b.RetryAfter
}

// fits reports whether checkOne passes a request of cost (sanitized) for
// state s at t, with no earlier request of the admission on s: the same
// checks, without building a Denial. admitOne asks checkOne for the denial
// only when fits is false. TestFitsMatchesCheckOne holds the two together.
func (b *Budget) fits(s *state, t int64, cost float64) bool {
	sp := &b.spec
	if sp.PerQueryLimit > 0 && cost > sp.PerQueryLimit {
		return false
	}
	if sp.MaxConcurrent > 0 && s != nil && int(s.inflight) >= sp.MaxConcurrent {
		return false
	}
	if sp.Rate > 0 {
		return cost <= withSlack(sp.Burst) && b.tab.fitsAt(s, t, cost, sp.Burst)
	}
	return true
}

// checkOne checks r, reqs[i] of an admission, against its budget b at t (b's
// clock), given s = b's state for r.Key (nil if none) and the slots and
// costs that earlier requests of the admission take from the same state.
func checkOne(b *Budget, r *Request, i int, s *state, t int64, extraSlots int, extraCost float64) (Denial, bool) {
	cost := sanitizeCost(r.Cost)
	sp := &b.spec
	if sp.PerQueryLimit > 0 && cost > sp.PerQueryLimit {
		return Denial{Index: i, Reason: ReasonPerQuery, Limit: b.text.perQuery}, false
	}
	if sp.Rate > 0 && cost > withSlack(sp.Burst) {
		return Denial{Index: i, Reason: ReasonPerQuery, Limit: b.text.burst}, false
	}
	if sp.MaxConcurrent > 0 {
		n := extraSlots
		if s != nil {
			n += int(s.inflight)
		}
		if n >= sp.MaxConcurrent {
			return Denial{Index: i, Reason: ReasonConcurrency, RetryAfter: b.concurrencyHint(), Limit: b.text.concurrency}, false
		}
	}
	if sp.Rate > 0 {
		need := cost + extraCost
		if need > withSlack(sp.Burst) {
			// Only the earlier requests of this admission make it too big.
			return Denial{Index: i, Reason: ReasonPerQuery, Limit: b.text.burst}, false
		}
		if !b.tab.fitsAt(s, t, need, sp.Burst) {
			at := b.tab.fitTime(s, t, need, sp.Burst)
			return Denial{Index: i, Reason: ReasonBudget, RetryAfter: time.Duration(at - t), Limit: b.text.burst}, false
		}
	}
	return Denial{}, true
}

// apply takes r's slot and debt at t (b's clock) in s, b's state for r.Key
// (nil: insert it), and returns the state charged. It appends a Warning,
// with Index i, if the budget is now at or past a limit.
func apply(b *Budget, r *Request, i int, s *state, t int64, warns []Warning) ([]Warning, *state) {
	cost := sanitizeCost(r.Cost)
	tb := &b.tab
	if s == nil {
		s = tb.insert(r.Key, t)
	}
	tb.charge(s, t, cost)
	s.inflight++
	b.inflight++
	if s.inflight == 1 && s != &tb.unkeyed {
		tb.reprio(s) // now in flight: last in eviction order
	}
	b.admitted++

	sp := &b.spec
	if !r.WarnOnly && !(sp.WarningThreshold > 0) {
		// An enforced request passed its check, so it is within every limit:
		// without a warning threshold there is nothing to report.
		return warns, s
	}
	// The fullest limit; on a tie the first of concurrency, per-query,
	// bucket. Kept in scalars: a Warning is built only if one is reported.
	fill, reason, limit := 0.0, "", ""
	if sp.MaxConcurrent > 0 {
		if f := float64(s.inflight) / float64(sp.MaxConcurrent); f > fill {
			fill, reason, limit = f, ReasonConcurrency, b.text.concurrency
		}
	}
	if sp.PerQueryLimit > 0 {
		if f := cost / sp.PerQueryLimit; f > fill {
			fill, reason, limit = f, ReasonPerQuery, b.text.perQuery
		}
	}
	if sp.Rate > 0 {
		if f := s.debt / sp.Burst; f > fill {
			fill, reason, limit = f, ReasonBudget, b.text.burst
		}
		if cost > withSlack(sp.Burst) {
			// Too big for the bucket, however empty: report it as the denial would.
			fill, reason, limit = math.Max(fill, cost/sp.Burst), ReasonPerQuery, b.text.burst
		}
	}
	over := fill > 1 && (reason != ReasonBudget || s.debt > withSlack(sp.Burst))
	if over || (sp.WarningThreshold > 0 && fill >= sp.WarningThreshold) {
		b.warned.Add(1)
		warns = append(warns, Warning{Index: i, Reason: reason, Fill: fill, Over: over, Limit: limit})
	}
	return warns, s
}
