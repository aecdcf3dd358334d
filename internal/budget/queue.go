package budget

import (
	"math"
	"slices"
	"sync/atomic"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// Waiting. A statement that a budget cannot admit yet may wait for room in a queue per budget
// and key, in arrival order: each waiter's place holds the room its requests need there (their
// slots and the cost they reserve), and [Admit] checks every request for a key as though the
// waiters ahead of it had been admitted: it takes only the room they leave (a newcomer refused
// so is told [Denial.Queued], and may join the queue behind them). So a statement arriving
// later never takes the room an earlier one waits for, and room beyond what they need is not
// left idle. A statement that asks several budgets at once waits in each of their queues and
// is admitted all or nothing, as ever; in a budget that has room for it while it waits for
// another's, it holds only the room it needs. Queues are ordered by one arrival count across
// every budget, so the earliest waiter of all is first in each of its queues and nothing
// arriving after it takes its room anywhere: no two waiters can each hold up the other (no
// deadlock), and no waiter is passed over for ever (no starvation). A waiter that a budget's
// health threshold holds back (Hold) holds up its key of that budget whole: a statement that
// passes the threshold behind it would take its turn. One exception: while a key has pending
// slots (Request.Pending: taken by statements that wait for a connection), a request whose
// statement holds a connection counts only the waiters ahead of it that hold one (check),
// since the others may wait for the very connection it holds; among the waiters that hold a
// connection the order stays the order of arrival. So while a key has pending slots, the first
// waiter that holds a connection is woken too when room is made (wakeFreed), and when a slot
// becomes pending (take), and when the one ahead of it leaves.
//
// A waiter tries again when its [Waiter.Wake] channel receives: when room is made for its key
// (a slot released, a refund, a waiter ahead of it leaving, or one that waited for that budget
// waiting no more: it fits there and waits for another, or health holds it back no longer) and
// none ahead of it waits for that budget (wakeFrom, settled), and when a shared budget's lease
// changes. Room made by the bucket draining is not signalled: a waiter refused for the bucket
// knows from its denial's RetryAfter when it fits, beside the room those ahead of it need
// (Denial.Queued), and tries again then.

// arrivals numbers waiters in the order they join their queues, across every budget.
var arrivals atomic.Uint64

// Waiter is one admission waiting for room in the queues of its budgets and keys, from
// [Join] to [Leave]. The zero value is ready for Join; a Waiter is used by one goroutine and
// may be reused once it left.
type Waiter struct {
	seq uint64 // its place in arrival order; 0 while in no queue
	// arrival is its place in arrival order from its first Join until Forget, kept across
	// Leave: a statement decided again (the rules were replaced while it waited) joins its new
	// queues in the place it had, not behind those that came after it.
	arrival   uint64
	wake      chan struct{} // buffered(1): try again
	connected bool          // its statement holds a connection: its requests are not Pending
	// Job is set for a batch job's Wait, which holds no connection and no statement while it
	// waits: it takes its turn in arrival order as any waiter, but does not count against a
	// queue's bound (MaxQueue), which bounds the statements waiting (and, under database/sql,
	// the connections they hold), is never refused for a full queue, and is never evicted.
	Job bool
	// evicted is the budget whose queue a waiter joining again in its place of arrival left w
	// beyond the bound of (Join); nil while w is not put out. Set under that budget's lock,
	// which Evicted takes to read it.
	evicted      *Budget
	evictedBound int // the MaxQueue it was put out beyond
}

// Evicted reports whether w, which joined its queues through reqs, was put out of one of them,
// left beyond its bound by a waiter that arrived before it and joined again: the index of the
// request whose budget's queue it was (-1 when none), and that queue's bound then. w must be
// refused as if it had found that queue full, and leave its other queues (Leave).
func Evicted(w *Waiter, reqs []Request) (full, bound int) {
	var buf [8]*Budget
	locked := lockAll(buf[:0], reqs)
	defer unlockAll(locked)
	for i := range reqs {
		if w.evicted != nil && reqs[i].Budget == w.evicted {
			return i, w.evictedBound
		}
	}
	return -1, 0
}

// Forget readies w for a new admission: its next Join takes a place at the back.
func (w *Waiter) Forget() { w.arrival = 0 }

// Arrive gives w its place in arrival order now, unless it has one: a statement that has not
// waited yet but may wait later as the same admission (one the pool lends a connection to for
// its EXPLAIN first) then joins the queues in the place of its arrival, as one joining again
// does, not behind those that arrived while it was away.
func (w *Waiter) Arrive() {
	if w.arrival == 0 {
		w.arrival = arrivals.Add(1)
	}
}

// Waiting reports whether w is in a queue (between Join and Leave).
func (w *Waiter) Waiting() bool { return w.seq != 0 }

// Wake returns the channel that receives when w should try to be admitted again.
func (w *Waiter) Wake() <-chan struct{} {
	if w.wake == nil {
		w.wake = make(chan struct{}, 1)
	}
	return w.wake
}

// signal asks w to try again; a signal already pending covers this one.
func (w *Waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// queue is one key's waiters, in arrival order.
type queue struct {
	ps []place
}

// place is a waiter's place in one budget's queue: the room its requests of the key need
// there, which the requests behind it leave to it (Budget.ahead), and what held it back there
// at its last try.
type place struct {
	w     *Waiter
	slots int     // its requests of the key
	cost  float64 // the cost they reserve, at most (Budget.reservation)
	// waits is set when the budget refused w at its last try: room made here is what it waits
	// for, and a wake goes no further than w (wakeFrom).
	waits bool
	// health is set while the budget's health threshold holds w back (Hold): nobody behind w
	// passes it, and they are told why.
	health bool
	why    Denial
	// granted is set when a release left room here for w, which is woken to take it (grant),
	// and when w is admitted (take), until it leaves: leaving the queue, w no longer counts
	// against its bound (waiting), though the room stays its own (ahead) until its try.
	granted bool
}

// hold records w's last try in p's budget: refused there (by its room, or for why) or not.
func (p *place) hold(refused bool, why *Denial) {
	p.waits, p.granted = refused, false
	p.health = refused && why.Reason == vocab.ReasonHealth
	if p.health {
		p.why = *why
		p.why.Index, p.why.Queued = 0, true
	}
}

// Join puts w in the queue of each request's budget and key whose Spec lets statements wait
// (MaxQueue > 0), all or nothing, and marks those requests as w's: at the back, or, when w
// waited before and was not told to Forget, in its place of arrival. why is the refusal that
// made w wait, by the budget of reqs[why.Index]: there w waits for that budget, and where it
// is a health threshold nobody behind w passes it (Hold). It returns -1 when w joined, or the
// index of a request whose queue is full (then w joined none).
//
// A waiter joining again in its place of arrival (decided again after a reload) is held to the
// bound by that place: it joins if fewer than MaxQueue waiters arrived before it, and the
// latest arrivals it then leaves beyond the bound are evicted (Evicted), so that the
// bound holds from the reload on, whichever came back first and whichever queue each waited in
// before (a reload may move a rule, or drop a budget's per). A lowered bound of its own queue
// sheds the waiters it leaves beyond it, in arrival order.
func Join(w *Waiter, reqs []Request, why *Denial) (refused int) {
	var buf [8]*Budget
	locked := lockAll(buf[:0], reqs)
	defer unlockAll(locked)
	for i := range reqs {
		b, key := reqs[i].Budget, reqs[i].Key
		bound := b.keys.spec.MaxQueue
		switch {
		case bound == 0 || w.Job:
		case w.arrival == 0:
			if b.queues[key].waiting() >= bound {
				return i
			}
		case b.shed[key].holds(w.arrival) || b.queues[key].arrivedBefore(w.arrival) >= bound:
			return i
		}
	}
	w.evicted = nil
	w.Wake() // made before it can be signalled
	if w.arrival == 0 {
		w.arrival = arrivals.Add(1)
	}
	w.seq = w.arrival
	w.connected = len(reqs) > 0 && !reqs[0].Pending // a claim's requests are pending alike
	by := reqs[why.Index].Budget
	for i := range reqs {
		r := &reqs[i]
		b := r.Budget
		if b.keys.spec.MaxQueue == 0 {
			continue
		}
		r.Waiter = w
		if b.queues == nil {
			b.queues = map[string]*queue{}
		}
		q := b.queues[r.Key]
		if q == nil {
			q = &queue{}
			b.queues[r.Key] = q
		}
		p := q.place(w) // set for a second request of the same budget and key
		if p == nil {
			j := len(q.ps) // in arrival order: at the back, unless w arrived before some
			for j > 0 && q.ps[j-1].w.seq > w.seq {
				j--
			}
			q.ps = slices.Insert(q.ps, j, place{w: w})
			b.waiters++
			p = &q.ps[j]
			p.hold(b == by, why)
		}
		p.slots++
		p.cost += b.reservation(r, math.Inf(1), 1)
		for bound := b.keys.spec.MaxQueue; q.waiting() > bound; {
			b.evict(q) // never w: fewer than bound arrived before it
		}
	}
	return -1
}

// Hold records that a health threshold of the budget of reqs[why.Index], checked before any
// budget's room, refused w at its last try, for why: w waits in its queues through reqs, and
// nobody behind it in that budget's queues passes it, while in its other budgets it holds only
// the room it needs. A try that reaches the budgets' room (Admit, Check) records its outcome
// itself.
func Hold(w *Waiter, reqs []Request, why *Denial) {
	var buf [8]*Budget
	locked := lockAll(buf[:0], reqs)
	defer unlockAll(locked)
	by := reqs[why.Index].Budget
	for i := range reqs {
		if r := &reqs[i]; r.Waiter == w {
			q := r.Budget.queues[r.Key]
			if j := q.index(w); j >= 0 {
				waited := q.ps[j].waits
				q.ps[j].hold(r.Budget == by, why)
				q.settled(j, waited)
			}
		}
	}
}

// noteTry records how b answered r, a request of a waiter in r's key's queue, at its try: its
// room needed there, and whether b refused it. first is set for the first of its admission's
// requests for the key, whose answer replaces the last try's (settled); the others' add to it.
// The caller holds b.mu.
func (b *Budget) noteTry(r *Request, first, refused bool) {
	q := b.queues[r.Key]
	j := q.index(r.Waiter)
	if j < 0 {
		return
	}
	p := &q.ps[j]
	if first {
		waited := p.waits
		*p = place{w: p.w, waits: refused}
		q.settled(j, waited)
	}
	p.slots++
	p.cost += b.reservation(r, math.Inf(1), 1)
	p.waits = p.waits || refused
}

// settled tells the waiters behind q's j-th, which waited for this budget at its last try
// (waited), that it waits no more (it fits here now and waits for another budget, holding only
// the room it needs, or no health threshold of this budget holds it back): the room made here
// while it waited, which woke it alone (wakeFrom), may be theirs beyond what it holds. A later
// request of the same admission for the key that this budget refuses makes the wake one too
// many: the waiters woken try again and wait on. The caller holds the budget's lock.
func (q *queue) settled(j int, waited bool) {
	if waited && !q.ps[j].waits {
		q.wakeFrom(j + 1)
	}
}

// len is how many wait in q.
func (q *queue) len() int {
	if q == nil {
		return 0
	}
	return len(q.ps)
}

// waiting is how many wait in q and count against its bound: all but those leaving (granted:
// a release left room for them, or they were admitted and have not left yet) and jobs
// (Waiter.Job).
func (q *queue) waiting() int {
	if q == nil {
		return 0
	}
	n := 0
	for _, p := range q.ps {
		if p.bounded() {
			n++
		}
	}
	return n
}

// bounded reports whether p counts against its queue's bound (waiting).
func (p *place) bounded() bool { return !p.granted && !p.w.Job }

// grant marks the waiters at the front of q that waited for b (refused at their last try) and
// that the room of s's key now admits, in order, each in the room those before it leave (those
// that wait for another budget hold their own): the release that made the room wakes them to
// take it (wakeFreed). The caller holds b.mu, with s's bucket drained to now.
func (b *Budget) grant(q *queue, s *state) {
	rate, burst, maxConcurrent := b.keys.limits(s)
	slots, debt := s.inflight, s.Debt
	for i := range q.ps {
		p := &q.ps[i]
		switch {
		case p.health:
			return
		case p.waits && (maxConcurrent > 0 && slots+p.slots > maxConcurrent ||
			rate > 0 && debt+p.cost > withSlack(burst)):
			return // it does not fit: nobody behind it passes it
		}
		p.granted = p.granted || p.waits
		slots, debt = slots+p.slots, debt+p.cost
	}
}

// leaving marks w's place in q, if any, as its room's (granted): w was admitted, and leaves.
func (q *queue) leaving(w *Waiter) {
	if p := q.place(w); p != nil {
		p.granted = true
	}
}

// index is w's place in q, or -1.
func (q *queue) index(w *Waiter) int {
	if q == nil {
		return -1
	}
	return slices.IndexFunc(q.ps, func(p place) bool { return p.w == w })
}

// place is w's place in q, or nil.
func (q *queue) place(w *Waiter) *place {
	if j := q.index(w); j >= 0 {
		return &q.ps[j]
	}
	return nil
}

// arrivedBefore is how many of q's waiters arrived before arrival and count against its bound
// (waiting).
func (q *queue) arrivedBefore(arrival uint64) int {
	if q == nil {
		return 0
	}
	n := 0
	for _, p := range q.ps {
		if p.w.seq < arrival && p.bounded() {
			n++
		}
	}
	return n
}

// evict takes the last of q's waiters, one that a waiter joining again in its place of arrival
// left beyond the bound, out of q, and tells it so: it is refused as if it had found the queue
// full (Evicted), and leaves its other queues then. The caller holds b.mu.
func (b *Budget) evict(q *queue) {
	j := len(q.ps) - 1
	for q.ps[j].w.Job { // a job counts against no bound: the last statement goes
		j--
	}
	last := q.ps[j].w
	q.ps = slices.Delete(q.ps, j, j+1)
	b.waiters--
	last.evicted, last.evictedBound = b, b.keys.spec.MaxQueue
	last.signal()
}

// Leave takes w out of every queue it joined through reqs, and tells the waiters behind it
// that the room it held may be theirs (wakeFrom). The requests are w's no longer.
func Leave(w *Waiter, reqs []Request) {
	if w.seq == 0 {
		return
	}
	var buf [8]*Budget
	locked := lockAll(buf[:0], reqs)
	defer unlockAll(locked)
	for i := range reqs {
		r := &reqs[i]
		if r.Waiter != w {
			continue
		}
		r.Waiter = nil
		b := r.Budget
		q := b.queues[r.Key]
		j := q.index(w)
		if j < 0 {
			continue // a second request of the same budget and key
		}
		q.ps = slices.Delete(q.ps, j, j+1)
		b.waiters--
		if len(q.ps) == 0 {
			delete(b.queues, r.Key)
			continue
		}
		q.wakeFrom(j)
		if w.connected {
			if c := q.firstConnected(); c != nil {
				c.signal() // perhaps first of those that hold a connection now
			}
		}
	}
	w.seq = 0
}

// shedRange is a span of arrivals, (from, to]: the waiters of a key that a lowered MaxQueue left
// beyond its bound, refused when they join again (decided again under the new rules).
type shedRange struct{ from, to uint64 }

func (r shedRange) holds(arrival uint64) bool { return arrival > r.from && arrival <= r.to }

// beyond returns, per key, the waiters beyond the first bound of its queue, in arrival order:
// those a MaxQueue lowered to bound sheds. nil when no queue is longer. The caller holds b.mu.
func (b *Budget) beyond(bound int) map[string]shedRange {
	var shed map[string]shedRange
	for key, q := range b.queues {
		if bound == 0 || len(q.ps) <= bound {
			continue
		}
		if shed == nil {
			shed = map[string]shedRange{}
		}
		shed[key] = shedRange{from: q.ps[bound-1].w.seq, to: q.ps[len(q.ps)-1].w.seq}
	}
	return shed
}

// Waiting reports how many statements wait for key's room in b.
func (b *Budget) Waiting(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.queues[key].len()
}

// ahead is what the waiters ahead of r for r's key (all of them for a request that does not
// wait) hold r to: the slots and cost they need, which r's check counts as taken, or, when a
// health threshold of b holds one of them back (Hold), its denial. With connected set (r holds
// a connection and the key has pending slots: see check), only the waiters that hold a
// connection count. The caller holds b.mu.
func (b *Budget) ahead(r *Request, connected bool) (slots int, cost float64, d *Denial) {
	q := b.queues[r.Key]
	if q == nil {
		return 0, 0, nil
	}
	for i := range q.ps {
		p := &q.ps[i]
		switch {
		case p.w == r.Waiter:
			return slots, cost, nil
		case connected && !p.w.connected:
			continue
		case p.health:
			d := p.why
			return 0, 0, &d
		}
		slots += p.slots
		cost += p.cost
	}
	return slots, cost, nil
}

// firstConnected returns q's first waiter that holds a connection, or nil.
func (q *queue) firstConnected() *Waiter {
	if q == nil {
		return nil
	}
	for _, p := range q.ps {
		if p.w.connected {
			return p.w
		}
	}
	return nil
}

// wakeFrom tells q's waiters from the j-th through the first that waits for this budget to try
// again, if none before the j-th waits for it: room made here (a release, a refund, the waiter
// that was j-th leaving) may be theirs, as those ahead of them that wait for other budgets hold
// only their own.
func (q *queue) wakeFrom(j int) {
	for i := range q.ps {
		p := &q.ps[i]
		if i >= j {
			p.w.signal()
		}
		if p.waits {
			return
		}
	}
}

// wakeKey tells the waiters for key that room made there may be theirs to try again
// (wakeFrom). The caller holds b.mu.
func (b *Budget) wakeKey(key string) {
	if q := b.queues[key]; q != nil {
		q.wakeFrom(0)
	}
}

// WakeWaiters tells every waiter of b to try again: the rules changed, and a statement that
// waits under the rules it was routed by must be decided again under the new ones (the
// engine's admission), whether they lift its budget's limits, close it, lower its max_queue
// or remove it. (Waking only the first of each queue would not reach the others: one that
// joins again in its place of arrival stays first, and wakes nobody.)
func (b *Budget) WakeWaiters() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, q := range b.queues {
		for _, p := range q.ps {
			p.w.signal()
		}
	}
}

// wakeAll tells the waiters of every key to try again, as wakeFreed does one key's (a shared
// budget's leases changed). The caller holds b.mu.
func (b *Budget) wakeAll() {
	for key := range b.queues {
		if s := b.keys.lookup(key); s != nil {
			b.wakeFreed(s)
		} else {
			b.wakeKey(key)
		}
	}
}
