package budget

import (
	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// lastSeq numbers budgets in creation order; an admission locks its budgets
// in this order so that two admissions over the same budgets cannot deadlock.
var lastSeq atomic.Uint64

// defaultHold is the concurrency RetryAfter hint before any query completed.
const defaultHold = 100 * time.Millisecond

// Budget is one configured budget: a reverse leaky bucket, a concurrency
// count and a per-query limit, kept per key (the value of the budget's `per`
// tag, or "" for all queries). [Admit] takes a slot and reserves debt;
// [Release] gives both back, trued up to the actual cost.
//
// A Budget is safe for concurrent use: one mutex guards its state. Create
// one with [New]; the zero value is not usable.
type Budget struct {
	seq uint64 // creation order, for lock ordering; immutable

	mu         sync.Mutex // protects the fields below
	keys       keys
	text       limitText
	unknown    float64 // the reservation for an unknown cost (Spec.unknownCost), once per spec
	meanHold   float64 // EMA of the seconds a released query held its slot, for the concurrency hint
	recentCost float64 // what released queries reserved or were charged, the larger ones at once (RecentCost)
	link       link    // a shared budget's coordinator (lease.go); zero in a local budget
	// queues are the statements waiting for room, per key (queue.go); waiters counts them all,
	// so that an admission with nobody waiting looks no further.
	queues  map[string]*queue
	waiters int
	shed    map[string]shedRange // the waiters a lowered MaxQueue left beyond it, per key (queue.go)
	// wouldWait holds, per key, the statements of a warn budget that run over its limits where
	// enforce would have had them wait (TakeWaiter), until they are released: for each, when
	// its wait would have ended (for bucket room: known from the debt when it was taken), or
	// the zero Time (for a slot: it ends when a statement does, wouldQueue).
	wouldWait map[string][]time.Time

	tally tally // the engine's decisions (counts.go), behind a lock of its own
}

// New returns a budget with no debt and nothing in flight.
func New(spec Spec) *Budget {
	spec = spec.normalize()
	return &Budget{seq: lastSeq.Add(1), keys: keys{spec: spec, byKey: map[string]*state{}},
		text: newLimitText(spec), unknown: spec.unknownCost()}
}

// SetSpec applies a reloaded spec at now, keeping each key's debt (drained
// at the old rate until now, at the new rate after) and in-flight count. A
// smaller MaxKeys evicts down to the new bound. O(number of keys) when the
// spec changed.
func (b *Budget) SetSpec(now time.Time, spec Spec) {
	spec = spec.normalize()
	b.mu.Lock()
	defer b.mu.Unlock()
	if spec == b.keys.spec {
		return // a reload that left the budget as it was: no walk over its keys
	}
	b.shed = b.beyond(spec.MaxQueue)
	b.keys.setSpec(now, spec)
	b.text, b.unknown = newLimitText(spec), spec.unknownCost()
}

// MaxCost is the largest cost, in execution seconds, that b ever admits one statement at: the
// smaller of its PerQueryLimit and its Burst (a larger cost never fits), +Inf with neither.
// A statement that runs for longer than this costs more than b could ever have admitted.
func (b *Budget) MaxCost() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, sp := math.Inf(1), &b.keys.spec
	if sp.PerQueryLimit > 0 {
		c = sp.PerQueryLimit
	}
	if sp.Rate > 0 {
		c = min(c, sp.Burst)
	}
	return c
}

// Request is one budget's part of an admission.
type Request struct {
	Budget *Budget // must not be nil
	Key    string  // the value of the budget's `per` tag; "" when it has none
	Cost   float64 // predicted execution seconds
	// Largest is the largest predicted cost of one statement of a request for several (a pgx
	// batch's, whose Cost is their sum): what PerQueryLimit judges, the limit of one
	// statement. 0: the request is one statement's, and PerQueryLimit judges Cost.
	Largest float64
	// Unknown marks a Cost that is only a guess (a pattern that has not run yet, priced by
	// what other patterns taught): PerQueryLimit still judges it, but the bucket reserves
	// the budget's reservation for an unknown cost instead (spec.go). Once admitted, Cost
	// holds what was reserved, which Release trues up.
	Unknown bool
	// Waiter is the waiter that queued for this request (queue.go); nil for one that did not
	// wait. While others wait for its key before it, it is refused.
	Waiter *Waiter
	// Pending marks a request admitted before its statement had a connection (the pgx-native
	// pool decides a statement before it takes one): its slot is pending until [Connect]. A
	// pending request is held to every slot in flight; a connected one, whose statement holds a
	// connection, only to the slots of running statements, so that it is never held up by a
	// statement waiting for a connection, perhaps the very one it holds. Admit takes it as it
	// is; Connect clears it.
	Pending bool
	// folds is how many times the budget had folded its keys into its unkeyed state when the
	// request was admitted (keys.fold): a keyed request admitted before a fold holds its slot
	// in the unkeyed state (keys.holder).
	folds uint64
	// taken is when the request was admitted: Release learns the time since as a slot's hold
	// time, whatever clock its cost is on.
	taken time.Time
	// waiter marks a request taken over the limits by TakeWaiter, counted among the key's
	// would-be waiters until it is released; waitEnd is its entry there (Budget.wouldWait).
	waiter  bool
	waitEnd time.Time
}

// Denial says which request refused an admission and why.
type Denial struct {
	Index  int    // into the requests passed to Admit
	Reason string // vocab.ReasonConcurrency, vocab.ReasonPerQuery or vocab.ReasonBudget
	// RetryAfter is how long to wait before the request could be admitted.
	// For vocab.ReasonBudget it is exact: a retry at now+RetryAfter fits, absent
	// other traffic, and one nanosecond earlier does not. For
	// vocab.ReasonConcurrency it is a hint: the key's mean hold time over the
	// slots (the budget's for a key with none yet), within [1ms, 1s]. For
	// vocab.ReasonPerQuery it is 0: do not retry.
	RetryAfter time.Duration
	// Limit names the limit, e.g. "max_concurrent=4", "burst_limit=10s".
	Limit string
	// Queued says the request was refused while others wait for its key before it (see
	// queue.go): it does not fit beside the room they need, or a health threshold holds one
	// of them back (then Reason and Limit are that waiter's). RetryAfter is a hint: for
	// vocab.ReasonBudget, when the bucket has room for the request beside the room they need,
	// should they still wait. Joining the queue behind them is the way in.
	Queued bool
}

// Warning reports a request whose budget is close to, or past, a limit after
// the admission.
type Warning struct {
	Index  int     // into the requests passed to Admit
	Reason string  // the fullest limit: vocab.ReasonConcurrency, vocab.ReasonPerQuery or vocab.ReasonBudget
	Fill   float64 // usage / limit after admission, e.g. 0.85
	Limit  string  // as in Denial
}

// Admit decides, at now, whether every request admits, and only if all do
// takes a concurrency slot and reserves Cost of debt in each (all or
// nothing: a denial anywhere leaves every budget untouched). Each admitted
// request must later be given back with [Release]. Admit counts nothing: the
// caller counts each statement's decision with [Budget.Count].
//
// On success it returns warns with a [Warning] appended for each request
// whose limit is at or above its WarningThreshold; pass a reused slice to
// avoid allocating. On refusal it returns the denial: one that can never fit
// (vocab.ReasonPerQuery) if any, else the one with the longest RetryAfter, since
// the caller must wait for all of them. A request whose Cost exceeds its
// budget's Burst never fits either: it is denied with vocab.ReasonPerQuery.
//
// The same budget may appear in several requests; for the same key their
// slots and costs add up. An admission sets each request's Cost to what it
// reserved (see Request.Unknown).
func Admit(now time.Time, reqs []Request, warns []Warning) ([]Warning, *Denial) {
	return reserve(now, reqs, warns, true)
}

// Check is Admit without taking anything: the denial Admit would return at
// now, or nil.
func Check(now time.Time, reqs []Request) *Denial {
	_, d := reserve(now, reqs, nil, false)
	return d
}

// reserve is Admit (take) and Check (!take): it checks every request with
// its budget locked and, if all fit and take is set, charges them. The
// coordinators of the shared budgets that refused are kicked once the
// budgets are unlocked: a kick is the coordinator's code, not the budget's.
//
// Most statements select one enforce budget, and an admission of one request
// is one budget's check and take under its own lock: no lock order to work
// out, no earlier request of the same key to count. Either way, a refusal
// taken for real is noted.
func reserve(now time.Time, reqs []Request, warns []Warning, take bool) ([]Warning, *Denial) {
	if len(reqs) == 1 {
		r := &reqs[0]
		b := r.Budget
		var kick func()
		b.mu.Lock()
		s := b.keys.lookup(r.Key)
		d := b.check(now, r, s, 0, 0)
		if r.Waiter != nil {
			b.noteTry(r, true, d != nil)
		}
		switch {
		case !take:
		case d == nil:
			warns, kick = b.take(now, r, s, 0, warns)
		default:
			kick = b.refused(now, r, d.Reason, 0)
		}
		b.mu.Unlock() // not deferred: nothing above panics, and this runs per statement
		if kick != nil {
			kick()
		}
		return warns, d
	}
	var buf [8]func()
	warns, worst, kicks := reserveLocked(now, reqs, warns, take, buf[:0])
	for _, kick := range kicks {
		kick()
	}
	return warns, worst
}

// reserveLocked is reserve's work under the budgets' locks; it appends to
// kicks the coordinators to kick.
func reserveLocked(now time.Time, reqs []Request, warns []Warning, take bool, kicks []func()) ([]Warning, *Denial, []func()) {
	var buf [8]*Budget
	locked := lockAll(buf[:0], reqs)
	defer unlockAll(locked)
	var worst *Denial
	for i := range reqs {
		r := &reqs[i]
		// Earlier requests of this admission for the same budget and key
		// count as already taken.
		slots, cost := 0, 0.0
		for j := range reqs[:i] {
			if o := &reqs[j]; o.Budget == r.Budget && o.Key == r.Key {
				slots++
				cost += o.Budget.reservation(o, math.Inf(1), 1)
			}
		}
		d := r.Budget.check(now, r, r.Budget.keys.lookup(r.Key), slots, cost)
		if r.Waiter != nil {
			r.Budget.noteTry(r, slots == 0, d != nil)
		}
		if d == nil {
			continue
		}
		d.Index = i
		if take {
			if kick := r.Budget.refused(now, r, d.Reason, slots); kick != nil {
				kicks = append(kicks, kick)
			}
		}
		if worst == nil || worse(d, worst) {
			worst = d
		}
	}
	if worst == nil && take {
		for i := range reqs {
			// Looked up again: an earlier take may have inserted the key, or evicted it.
			r := &reqs[i]
			var kick func()
			if warns, kick = r.Budget.take(now, r, r.Budget.keys.lookup(r.Key), i, warns); kick != nil {
				kicks = append(kicks, kick)
			}
		}
	}
	return warns, worst, kicks
}

// lockAll locks each distinct budget once, in creation order, and returns
// them for unlockAll. Requests are few: a linear search for duplicates and an
// insertion sort into buf.
func lockAll(buf []*Budget, reqs []Request) []*Budget {
	for _, r := range reqs {
		if !slices.Contains(buf, r.Budget) {
			buf = append(buf, r.Budget)
		}
	}
	for i := 1; i < len(buf); i++ {
		for j := i; j > 0 && buf[j-1].seq > buf[j].seq; j-- {
			buf[j-1], buf[j] = buf[j], buf[j-1]
		}
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

// worse reports whether a should be reported instead of b: a refusal that
// never fits first, then the longest wait.
func worse(a, b *Denial) bool {
	aNever, bNever := a.Reason == vocab.ReasonPerQuery, b.Reason == vocab.ReasonPerQuery
	if aNever != bNever {
		return aNever
	}
	return a.RetryAfter > b.RetryAfter
}

// perQuery is what PerQueryLimit judges of r: its one statement's cost, or the largest of its
// statements' (Largest).
func (r *Request) perQuery() float64 {
	if r.Largest > 0 {
		return sanitizeCost(r.Largest)
	}
	return sanitizeCost(r.Cost)
}

// check checks r against b at now, where s is the state of r's key (nil: absent), given the
// slots and cost that earlier requests of the admission take from the same key: nil if r fits,
// else why not (allocated only then). The caller holds b.mu.
//
// While others wait for r's key before it, r takes only the room they leave: their slots and
// costs count as taken (queue.go), and one that a health threshold of b holds back refuses r
// as it waits. A connected request (not Request.Pending) while the key has pending slots
// counts only the connected waiters ahead of it: the others may be waiting for those very
// slots, whose statements wait for a connection, perhaps the one r's statement holds. With no
// pending slot every waiter ahead counts.
//
// A pending request counts every slot in flight against max_concurrent; a connected one only
// the slots of running statements (Request.Pending).
func (b *Budget) check(now time.Time, r *Request, s *state, slots int, extra float64) *Denial {
	aheadSlots, aheadCost := 0, 0.0
	if b.waiters > 0 {
		var d *Denial
		if aheadSlots, aheadCost, d = b.ahead(r, !r.Pending && s != nil && s.pending > 0); d != nil {
			return d
		}
	}
	sp := &b.keys.spec
	if sp.PerQueryLimit > 0 && r.perQuery() > sp.PerQueryLimit { // a guess too: see Request.Unknown
		return &Denial{Reason: vocab.ReasonPerQuery, Limit: b.text.perQuery}
	}
	need := b.reservation(r, math.Inf(1), 1) + extra
	if sp.Rate > 0 && need > withSlack(sp.Burst) {
		// No wait can make room: the bucket is too small for this query.
		return &Denial{Reason: vocab.ReasonPerQuery, Limit: b.text.neverFits(need)}
	}
	rate, burst, maxConcurrent := b.keys.limits(s)
	if s == nil {
		s = &state{} // an absent key is empty
	} else {
		s.Charge(now, rate, 0) // drained to now here, so that take charges by addition
	}
	inflight, debt := s.heldTo(r)
	// The waiters ahead of r take their room first; one ahead is what a refusal waits for.
	queued := aheadSlots > 0
	slots, extra, need = slots+aheadSlots, extra+aheadCost, need+aheadCost
	if sp.MaxConcurrent > 0 && inflight+slots >= maxConcurrent {
		return &Denial{Reason: vocab.ReasonConcurrency, RetryAfter: b.concurrencyHint(s, inflight+slots-maxConcurrent+1),
			Limit: b.text.concurrency, Queued: queued}
	}
	if r.Unknown {
		need = b.reservation(r, burst-debt-extra, slotsOf(maxConcurrent)-inflight-slots) + extra
	}
	if sp.Rate > 0 && debt+need > withSlack(burst) && !emptyFits(debt+aheadCost, rate) {
		if r.Unknown {
			// It fits the moment the bucket has any room, whose share it then reserves.
			need = extra + burst*leastRoom
		}
		// When it fits: with the costs of the waiters ahead taken first, as if they were
		// admitted now (they may be larger together than the burst, the bucket empty).
		bk := Bucket{Debt: debt + aheadCost, Last: s.Last}
		return &Denial{Reason: vocab.ReasonBudget, RetryAfter: b.retryAfter(bk, now, rate, burst, need-aheadCost),
			Limit: b.text.burst, Queued: queued}
	}
	return nil
}

// leastRoom is the room, as a fraction of the burst, that a statement of unknown cost is told
// to wait for: any room admits one (reservation), and this much is past withSlack's rounding.
const leastRoom = 1e-9

// reservation is the cost r reserves in b where its key's bucket has room
// left and free slots are free besides r's: its Cost, or for an unknown cost
// the spec's reservation for one, cut while some room is left to the share of
// it that r's slot and each free one would get, one more share kept back. So
// an unknown cost alone never refuses a statement while the bucket has room,
// nor do the unknown costs of statements in flight together (at a cold start,
// every statement's) while their real costs leave room: they never reserve
// it all, and a statement of known cost that comes into a slot freed beside
// them still finds room. Past a budget's slots (without max_concurrent,
// coldSlots), one takes what is left, and the next waits for room. The
// caller holds b.mu.
func (b *Budget) reservation(r *Request, room float64, free int) float64 {
	if !r.Unknown {
		return sanitizeCost(r.Cost)
	}
	c := b.unknown
	if room > 0 {
		c = min(c, room/float64(max(0, free)+1))
	}
	return c
}

// take charges r, reqs[i] of an admission, to b at now, in s, the state of r's key (nil:
// absent, inserted here), and appends a Warning if the budget is now at or past a limit. In a
// shared budget it returns the coordinator's kick when r's key runs on a lease the coordinator
// did not give it (lease.go), for the caller to call once b is unlocked. The caller holds b.mu.
func (b *Budget) take(now time.Time, r *Request, s *state, i int, warns []Warning) (_ []Warning, kick func()) {
	if s == nil {
		s = b.keys.insert(r.Key, now)
	}
	cost := sanitizeCost(r.Cost)
	if r.Unknown { // reserved by the room left (reservation)
		// check drained s to now; earlier takes are in Debt and in inflight
		_, burst, maxConcurrent := b.keys.limits(s)
		inflight, debt := s.heldTo(r)
		cost = b.reservation(r, burst-debt, slotsOf(maxConcurrent)-inflight)
	}
	// A budget without a bucket keeps no debt: none to show, nor for a reload that gives it a
	// bucket to inherit.
	if b.keys.spec.Rate > 0 {
		s.Debt += cost // check drained s to now
	}
	b.keys.take(s)
	if r.Pending {
		s.pending++
		s.pendingCost += cost
		if b.waiters > 0 {
			b.wakeConnected(s.key) // it may pass the waiters that hold no connection now
		}
	}
	if r.Waiter != nil {
		b.queues[r.Key].leaving(r.Waiter) // admitted: it counts against the bound no more
	}
	if p := s.part; p != nil {
		p.offered += cost
		p.wanted = max(p.wanted, s.inflight)
		if !p.leased {
			kick = b.link.kick // a provisional lease: its own comes at an early sync
		}
	}
	if b.keys.spec.WarningThreshold > 0 { // else nothing asked to be warned
		warns = b.warn(s, r, i, warns) // before r.Cost holds the reservation
	}
	r.Cost, r.folds, r.taken = cost, b.keys.folds, now // what Release trues up, where, and since when
	return warns, kick
}

// warn appends a Warning for r, reqs[i] of an admission that take just charged to s, when the
// fullest of b's limits is at or past its WarningThreshold; on a tie the first of concurrency,
// per-query, bucket. per_query_limit's fill is that of what it judges, r's predicted cost (a
// guess too), not the reservation that take puts in r.Cost after. The caller holds b.mu.
func (b *Budget) warn(s *state, r *Request, i int, warns []Warning) []Warning {
	sp := &b.keys.spec
	_, burst, maxConcurrent := b.keys.limits(s)
	fill, reason, limit := 0.0, "", ""
	if sp.MaxConcurrent > 0 {
		if f := float64(s.inflight) / float64(max(maxConcurrent, 1)); f > fill {
			fill, reason, limit = f, vocab.ReasonConcurrency, b.text.concurrency
		}
	}
	if sp.PerQueryLimit > 0 {
		if f := r.perQuery() / sp.PerQueryLimit; f > fill {
			fill, reason, limit = f, vocab.ReasonPerQuery, b.text.perQuery
		}
	}
	if sp.Rate > 0 && burst > 0 {
		if f := s.Debt / burst; f > fill {
			fill, reason, limit = f, vocab.ReasonBudget, b.text.burst
		}
	}
	if fill >= sp.WarningThreshold {
		warns = append(warns, Warning{Index: i, Reason: reason, Fill: fill, Limit: limit})
	}
	return warns
}

// Release gives back the slot that [Admit] took for r, whose statement cost
// actual seconds, and trues r's key's debt up by actual − r.Cost (a refund
// when the query was cheaper than predicted), never below zero; the time since
// r was admitted is learned as a hold time (the RetryAfter hint of a refusal
// for concurrency: the cost may be on the server's clock, the slot is held on
// the client's). A
// request still pending (its statement never got its connection) gives back a
// pending slot. A Release with nothing in flight for the key (never admitted,
// or released twice) changes nothing. r is only read.
func Release(now time.Time, r *Request, actual float64) { release(now, r, actual, true) }

// Return is Release for a request whose statement never ran (refused after
// all, abandoned while it waited for its connection, or its caller panicked
// before sending it): its slot goes back and its reserved cost is refunded,
// and no hold time is learned from it.
func Return(now time.Time, r *Request) { release(now, r, 0, false) }

// release is Release (ran) and Return.
func release(now time.Time, r *Request, actual float64, ran bool) {
	b := r.Budget
	b.mu.Lock()
	if r.waiter {
		b.unwait(r.Key, r.waitEnd)
	}
	if s := b.keys.holder(r); s != nil && s.inflight > 0 {
		actual = sanitizeCost(actual)
		reserved := sanitizeCost(r.Cost)
		if r.Pending && s.pending > 0 {
			s.unpend(reserved)
		}
		s.Charge(now, b.keys.rate(s), actual-reserved)
		b.keys.give(s)
		if s.part != nil {
			s.part.used += actual
		}
		if ran { // else no hold time or cost to learn
			held := max(now.Sub(r.taken), 0).Seconds()
			learn(&b.meanHold, held)
			learn(&s.meanHold, held)
			learnPeak(&b.recentCost, max(actual, reserved))
		}
		if b.waiters > 0 {
			b.wakeFreed(s) // the slot, and any refund, may be a waiter's room
		}
	}
	b.mu.Unlock() // not deferred: nothing above panics, and this runs per statement
}

// learn moves the moving average *mean towards v (an EMA of weight 0.1), or sets it to v when
// it has no value yet (0).
func learn(mean *float64, v float64) {
	if *mean == 0 {
		*mean = v
		return
	}
	*mean += 0.1 * (v - *mean)
}

// learnPeak follows v as learn does when it is smaller than *peak, and rises to it at once when
// it is larger: a recent value that the large ones set.
func learnPeak(peak *float64, v float64) {
	if v >= *peak {
		*peak = v
		return
	}
	learn(peak, v)
}

// RecentCost is what the budget's recent statements cost, in execution seconds: the larger of
// what each reserved when admitted (its prediction) and what it was charged when released,
// rising at once to a larger one and moving slowly back towards smaller ones (learnPeak), at
// most the budget's burst (a statement that overran it says nothing of what fits); 0 before
// any ran.
func (b *Budget) RecentCost() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if burst := b.keys.spec.Burst; b.keys.spec.Rate > 0 && burst > 0 {
		return min(b.recentCost, burst)
	}
	return b.recentCost
}

// Connect tells b, at now, that the statement of r, a request admitted pending
// (Request.Pending), has its connection: its slot is a running one from now on, and r is
// pending no more. While r waited for its connection, connected statements may have overtaken
// its slot (or a shared budget's lease shrunk): when the key's running statements, r's
// included, are now more than its max_concurrent, r gives its slot back and the cost it
// reserved is refunded, as if it had never been admitted, and Connect reports false: the
// caller must admit the statement again, now connected. A request not pending, or whose key
// has nothing in flight, changes nothing and reports true.
func Connect(now time.Time, r *Request) bool {
	if !r.Pending {
		return true
	}
	b := r.Budget
	b.mu.Lock()
	ok := b.connect(now, r)
	b.mu.Unlock() // not deferred: connect does not panic, and this runs per pool statement
	return ok
}

// connect is Connect's work under b.mu.
func (b *Budget) connect(now time.Time, r *Request) bool {
	s := b.keys.holder(r)
	if s == nil || s.pending == 0 {
		return true
	}
	s.unpend(sanitizeCost(r.Cost))
	r.Pending = false
	if b.keys.spec.MaxConcurrent == 0 {
		return true
	}
	if _, _, maxConcurrent := b.keys.limits(s); s.inflight-s.pending <= maxConcurrent {
		return true
	}
	s.Charge(now, b.keys.rate(s), -sanitizeCost(r.Cost)) // never admitted: no hold time to learn
	b.keys.give(s)
	if b.waiters > 0 {
		b.wakeFreed(s)
	}
	return false
}

// wakeFreed tells the waiters for s's key, whose slot or debt just went down, to try again:
// those from the first through the first that waits for b (wakeFrom), as the queue admits in
// arrival order; and while the key has pending slots the first waiter that holds a connection,
// as it then passes the waiters ahead of it that hold none (check), so that the room a running
// statement gives back reaches it behind one that waits for a pending slot. The caller holds
// b.mu.
func (b *Budget) wakeFreed(s *state) {
	q := b.queues[s.key]
	if q == nil {
		return
	}
	b.grant(q, s)
	q.wakeFrom(0)
	if s.pending > 0 {
		if c := q.firstConnected(); c != nil {
			c.signal()
		}
	}
}

// wakeConnected tells the first waiter for key that holds a connection, if any, to try again.
// The caller holds b.mu.
func (b *Budget) wakeConnected(key string) {
	if c := b.queues[key].firstConnected(); c != nil {
		c.signal()
	}
}

// Adjust corrects, at now, what released request r was charged by delta execution seconds
// (negative: a refund), as Release would have charged had the cost been known then: the engine
// trues up a charge made on the client's clock once the server reports its own. The key's
// usage not yet reported to a shared budget's coordinator is corrected too (never below zero:
// what was reported stays reported). A key whose state is gone (evicted once its debt
// drained) is left alone, as is a delta that is not finite.
func Adjust(now time.Time, r Request, delta float64) {
	if !(math.Abs(delta) <= maxCost) {
		return
	}
	b := r.Budget
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.keys.holder(&r)
	if s == nil {
		return
	}
	b.keys.adjust(s, now, delta)
	if s.part != nil {
		s.part.used = max(0, s.part.used+delta)
	}
	if delta < 0 && b.waiters > 0 {
		b.wakeKey(r.Key) // the refund may be a waiter's room
	}
}

// TakeWaiter is what a budget in warn mode does, at now, with request r that [Admit] refused
// with d where the budget lets statements wait for room up to maxWait (and at most MaxQueue of
// them per key): enforce would not refuse such a statement but have it wait, and admit it once
// room came. So when the key's would-be waiters leave room in its queue and the wait for room
// looks no longer than maxWait, TakeWaiter takes r over the limits (its slot and cost count,
// as they would once it was admitted), counts it among the key's would-be waiters until it is
// released, and reports true: the statement runs unwarned. Else it takes nothing and reports
// false: enforce would refuse it. The wait is d's for the bucket (exact for r's cost, the
// would-be waiters' costs in the debt); for max_concurrent, one mean hold time for every
// max_concurrent of the key's statements in flight beyond the limit, r's slot included: the
// slots in use free together, as after a burst, the first max_concurrent waiters take them, the
// next ones wait for those to end. (Slots that free at staggered times serve the waiters
// sooner: for them the estimate errs by at most one mean hold time, towards a warning. The mean
// hold time is unknown until a statement of the budget has ended: until then such a wait
// counts as short, since taking it as long would warn about every statement beyond the limit in
// a burst of short ones at a process's start.) A per-query limit refuses whatever the wait.
func TakeWaiter(now time.Time, r *Request, d *Denial, maxWait time.Duration) bool {
	b := r.Budget
	var kick func()
	b.mu.Lock()
	ok := b.wouldAdmit(now, r, d, maxWait)
	if ok {
		if b.wouldWait == nil {
			b.wouldWait = map[string][]time.Time{}
		}
		r.waiter, r.waitEnd = true, time.Time{}
		if d.Reason == vocab.ReasonBudget {
			r.waitEnd = now.Add(d.RetryAfter)
		}
		b.wouldWait[r.Key] = append(b.wouldWait[r.Key], r.waitEnd)
		_, kick = b.take(now, r, b.keys.lookup(r.Key), 0, nil)
	}
	b.mu.Unlock()
	if kick != nil {
		kick()
	}
	return ok
}

// wouldAdmit reports whether enforce would admit r, refused with d at now, within maxWait rather
// than refuse it (TakeWaiter). The caller holds b.mu.
func (b *Budget) wouldAdmit(now time.Time, r *Request, d *Denial, maxWait time.Duration) bool {
	if maxWait <= 0 || b.wouldQueue(now, r.Key) >= b.keys.spec.MaxQueue {
		return false
	}
	switch d.Reason {
	case vocab.ReasonBudget:
		return d.RetryAfter <= maxWait
	case vocab.ReasonConcurrency:
		s := b.keys.lookup(r.Key)
		_, _, maxConcurrent := b.keys.limits(s)
		hold := b.meanHoldOf(s)
		if s == nil || hold == 0 || maxConcurrent <= 0 {
			return true
		}
		over := s.inflight - maxConcurrent + 1
		turns := (over + maxConcurrent - 1) / maxConcurrent
		return hold*float64(turns) <= maxWait.Seconds()
	}
	return false
}

// wouldQueue is how many of key's would-be waiters (TakeWaiter) enforce would have waiting in
// its queue at now: one waiting for bucket room until its wait ended; under a max_concurrent,
// no more than run beyond it, as enforce admits its waiters in order as slots free. The caller
// holds b.mu.
func (b *Budget) wouldQueue(now time.Time, key string) int {
	n := 0
	for _, end := range b.wouldWait[key] {
		if end.IsZero() || end.After(now) {
			n++
		}
	}
	if s := b.keys.lookup(key); s != nil {
		if _, _, maxConcurrent := b.keys.limits(s); maxConcurrent > 0 {
			n = min(n, max(s.inflight-maxConcurrent, 0))
		}
	}
	return n
}

// unwait counts a would-be waiter of key (TakeWaiter), whose wait ends at end, out. The caller
// holds b.mu.
func (b *Budget) unwait(key string, end time.Time) {
	w := b.wouldWait[key]
	if i := slices.IndexFunc(w, end.Equal); i >= 0 {
		w = slices.Delete(w, i, i+1)
	}
	if len(w) == 0 {
		delete(b.wouldWait, key)
	} else {
		b.wouldWait[key] = w
	}
}

// concurrencyHint is [Denial.RetryAfter] for vocab.ReasonConcurrency, for a statement that
// fits once over statements in flight or waiting ahead of it have left: as many turns of the
// budget's slots, each the key's mean hold (meanHoldOf) shared among them. Only a hint: slots
// free when queries finish, which nothing here can predict.
func (b *Budget) concurrencyHint(s *state, over int) time.Duration {
	hold := b.meanHoldOf(s)
	if hold == 0 {
		return defaultHold
	}
	d := time.Duration(hold * 1e9 * float64(max(over, 1)) / float64(max(1, b.keys.spec.MaxConcurrent)))
	return min(max(d, time.Millisecond), time.Second)
}

// meanHoldOf is how long a statement of s's key holds its slot: the key's mean, the budget's
// for a key with none yet (s nil or new). The caller holds b.mu.
func (b *Budget) meanHoldOf(s *state) float64 {
	if s != nil && s.meanHold > 0 {
		return s.meanHold
	}
	return b.meanHold
}

// Snapshot is a budget's state, for introspection and gauges: its counts at one instant, its
// debts summed over the keys as [Budget.Snapshot] reads them.
type Snapshot struct {
	Spec     Spec
	Debt     float64 // execution seconds, summed over keys, drained to the snapshot's time
	MaxDebt  float64 // the largest debt of one key
	InFlight int     // queries admitted and not yet released, summed over keys
	Waiting  int     // statements waiting in the budget's queues (queue.go), summed over keys
	Keys     int     // per-key states held
	Evicted  uint64  // key states evicted to make room
	// Decisions are the statements' decisions that the engine counted with [Budget.Count].
	Decisions Decisions
}

// scrapeChunk is how many keys [Budget.Snapshot] reads per hold of the
// budget's lock: a budget keyed per tenant may hold a hundred thousand keys,
// and a scrape must not keep its statements waiting while it reads them all.
const scrapeChunk = 1024

// Snapshot reports the budget at now, for a scrape rather than the hot path.
// The counts are read at one instant; the debts are summed over the keys a
// chunk at a time, the lock released between chunks so that statements are
// admitted meanwhile, and a key added or evicted during the scrape may be
// left out. (A running sum cannot replace the walk: each key drains on its
// own and stops at zero. Copying the keys out would hold the lock as long as
// reading them.)
func (b *Budget) Snapshot(now time.Time) Snapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := &b.keys
	snap := Snapshot{Spec: k.spec, InFlight: k.inflight, Waiting: b.waiters, Keys: k.count(), Evicted: k.evicted}
	if s := k.unkeyed; s != nil {
		snap.addDebt(s.DebtAt(now, k.rate(s)))
	}
	n := 0
	// Ranging over the map across the unlocked pauses is sound: every map
	// access is under b.mu, and an entry deleted before it is reached is not
	// produced.
	for _, s := range k.byKey {
		snap.addDebt(s.DebtAt(now, k.rate(s)))
		if n++; n%scrapeChunk == 0 {
			b.pause()
		}
	}
	snap.Decisions = b.tally.decisions(now, snap.Debt)
	return snap
}

func (s *Snapshot) addDebt(d float64) {
	s.Debt += d
	s.MaxDebt = max(s.MaxDebt, d)
}

// testHookPause, when set by a test, runs in each pause of a scrape, with the
// budget unlocked.
var testHookPause func()

// pause releases b.mu for a moment in the middle of a scrape and yields, so
// that a statement waiting for the lock takes it before the scrape goes on.
// The caller holds b.mu.
func (b *Budget) pause() {
	b.mu.Unlock()
	defer b.mu.Lock()
	if testHookPause != nil {
		testHookPause()
	}
	runtime.Gosched()
}
