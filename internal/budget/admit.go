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
// must later be given back with [Budget.Release] with the same key and cost.
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
	var buf [8]*Budget
	locked := lockAll(buf[:0], reqs)
	defer unlockAll(locked)

	if d, ok := check(now, reqs, true); !ok {
		return warns, escape(d)
	}
	for i := range reqs {
		warns = apply(now, reqs, i, warns)
	}
	return warns, nil
}

// Check is Admit without taking anything: the denial Admit would return now,
// or nil. It counts nothing.
func Check(now time.Time, reqs []Request) *Denial {
	var buf [8]*Budget
	locked := lockAll(buf[:0], reqs)
	defer unlockAll(locked)
	if d, ok := check(now, reqs, false); !ok {
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
// state. It returns the denial to report and false if any enforced request
// fails; count adds each failing budget's Blocked counter.
func check(now time.Time, reqs []Request, count bool) (Denial, bool) {
	var worst Denial
	denied := false
	for i, r := range reqs {
		if r.WarnOnly {
			continue
		}
		d, ok := checkOne(now, reqs, i)
		if ok {
			continue
		}
		if count {
			r.Budget.blocked.Add(1)
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

// checkOne checks reqs[i], counting the slots and costs of earlier requests
// for the same budget and key as already taken.
func checkOne(now time.Time, reqs []Request, i int) (Denial, bool) {
	r := reqs[i]
	b := r.Budget
	cost := sanitizeCost(r.Cost)
	extraSlots, extraCost := 0, 0.0
	for _, o := range reqs[:i] {
		if o.Budget == b && o.Key == r.Key {
			extraSlots++
			extraCost += sanitizeCost(o.Cost)
		}
	}
	sp := &b.spec
	if sp.PerQueryLimit > 0 && cost > sp.PerQueryLimit {
		return Denial{Index: i, Reason: ReasonPerQuery, Limit: b.text.perQuery}, false
	}
	if sp.Rate > 0 && cost > withSlack(sp.Burst) {
		return Denial{Index: i, Reason: ReasonPerQuery, Limit: b.text.burst}, false
	}
	s := b.tab.keys[r.Key]
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
		t := b.clock(now)
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

// apply takes reqs[i]'s slot and debt, then appends a Warning if the budget
// is now at or past a limit.
func apply(now time.Time, reqs []Request, i int, warns []Warning) []Warning {
	r := reqs[i]
	b := r.Budget
	cost := sanitizeCost(r.Cost)
	t := b.clock(now)
	tb := &b.tab
	s := tb.keys[r.Key]
	if s == nil {
		s = tb.insert(r.Key, t)
	}
	tb.charge(s, t, cost)
	s.inflight++
	b.inflight++
	if s.inflight == 1 {
		tb.reprio(s) // now in flight: last in eviction order
	}
	b.admitted.Add(1)

	sp := &b.spec
	w := Warning{Index: i}
	consider := func(fill float64, reason, limit string) {
		if fill > w.Fill {
			w.Fill, w.Reason, w.Limit = fill, reason, limit
		}
	}
	if sp.MaxConcurrent > 0 {
		consider(float64(s.inflight)/float64(sp.MaxConcurrent), ReasonConcurrency, b.text.concurrency)
	}
	if sp.PerQueryLimit > 0 {
		consider(cost/sp.PerQueryLimit, ReasonPerQuery, b.text.perQuery)
	}
	if sp.Rate > 0 {
		consider(s.debt/sp.Burst, ReasonBudget, b.text.burst)
	}
	if sp.Rate > 0 && cost > withSlack(sp.Burst) {
		// Too big for the bucket, however empty: report it as the denial would.
		w.Fill, w.Reason, w.Limit = math.Max(w.Fill, cost/sp.Burst), ReasonPerQuery, b.text.burst
	}
	w.Over = w.Fill > 1 && (w.Reason != ReasonBudget || s.debt > withSlack(sp.Burst))
	if w.Over || (sp.WarningThreshold > 0 && w.Fill >= sp.WarningThreshold) {
		b.warned.Add(1)
		warns = append(warns, w)
	}
	return warns
}
