package budget

import (
	"slices"
	"sync/atomic"
)

// Waiting. A statement that a budget cannot admit yet may wait for room in a queue per budget
// and key, and is admitted in arrival order: while anyone waits for a key, [Admit] refuses every
// request for that key but the first waiter's (a newcomer is told why the first waits, and may
// join the queue behind it), so a statement arriving later never takes the room an earlier one
// waits for. A statement that asks several budgets at once waits in each of their queues and
// is admitted only when it is first in all of them, all or nothing as ever. Queues are ordered
// by one arrival count across every budget, so the earliest waiter of all is first in each of
// its queues: no two waiters can each hold up the other (no deadlock), and no waiter is passed
// over for ever (no starvation). The price is that a waiter first in one queue but not in
// another holds up its first queue until it is admitted or leaves. One exception: while a key
// has pending slots (Request.Pending: taken by statements that wait for a connection), a
// request whose statement holds a connection passes the waiters that hold none when a running
// slot is free (check), since they may wait for the very connection it holds; among the
// waiters that hold a connection the order stays the order of arrival. So while a key has
// pending slots, the first waiter that holds a connection is woken too when room is made
// (wakeFreed), and when a slot becomes pending (take), and when the one ahead of it leaves.
//
// A waiter tries again when its [Waiter.Wake] channel receives: when it becomes first, when a
// slot of its key is released, and when a shared budget's lease changes. Room made by the
// bucket draining is not signalled: the first waiter knows from its denial's RetryAfter when
// it fits, and sleeps until then.

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
	// evicted is set when a waiter joining again in its place of arrival left w beyond its
	// queue's bound (Join), under that budget's lock, which Evicted takes to read it.
	evicted bool
}

// Evicted reports whether w, which joined its queues through reqs, was put out of one of them,
// left beyond its bound by a waiter that arrived before it and joined again: w must be refused
// as if it had found the queue full, and leave its other queues (Leave).
func Evicted(w *Waiter, reqs []Request) bool {
	var buf [8]*Budget
	locked := lockAll(buf[:0], reqs)
	defer unlockAll(locked)
	return w.evicted
}

// Forget readies w for a new admission: its next Join takes a place at the back.
func (w *Waiter) Forget() { w.arrival = 0 }

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

// queue is one key's waiters, in arrival order, and why the first of them waits: what a
// request arriving behind them is told.
type queue struct {
	ws  []*Waiter
	why Denial
}

// Join puts w in the queue of each request's budget and key whose Spec lets statements wait
// (MaxQueue > 0), all or nothing, and marks those requests as w's: at the back, or, when w
// waited before and was not told to Forget, in its place of arrival. why is the denial
// that made w wait: what a request arriving behind w is told while w is first. It returns -1
// when w joined, or the index of a request whose queue is full (then w joined none).
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
		case bound == 0:
		case w.arrival == 0:
			if len(b.queues[key].waiters()) >= bound {
				return i
			}
		case b.shed[key].holds(w.arrival) || b.queues[key].ahead(w.arrival) >= bound:
			return i
		}
	}
	w.evicted = false
	w.Wake() // made before it can be signalled
	if w.arrival == 0 {
		w.arrival = arrivals.Add(1)
	}
	w.seq = w.arrival
	w.connected = len(reqs) > 0 && !reqs[0].Pending // a claim's requests are pending alike
	for i := range reqs {
		r := &reqs[i]
		if r.Budget.keys.spec.MaxQueue == 0 {
			continue
		}
		r.Waiter = w
		b := r.Budget
		if slices.Contains(b.queues[r.Key].waiters(), w) {
			continue // a second request of the same budget and key
		}
		if b.queues == nil {
			b.queues = map[string]*queue{}
		}
		q := b.queues[r.Key]
		if q == nil {
			q = &queue{why: *why}
			q.why.Index = 0
			b.queues[r.Key] = q
		}
		j := len(q.ws) // in arrival order: at the back, unless w arrived before some
		for j > 0 && q.ws[j-1].seq > w.seq {
			j--
		}
		q.ws = slices.Insert(q.ws, j, w)
		b.waiters++
		for bound := b.keys.spec.MaxQueue; len(q.ws) > bound; {
			b.evict(q)
		}
	}
	return -1
}

// ahead is how many of q's waiters arrived before arrival.
func (q *queue) ahead(arrival uint64) int {
	n := 0
	for _, w := range q.waiters() {
		if w.seq < arrival {
			n++
		}
	}
	return n
}

// evict takes the last of q's waiters, one that a waiter joining again in its place of arrival
// left beyond the bound, out of q, and tells it so: it is refused as if it had found the queue
// full (Evicted), and leaves its other queues then. The caller holds b.mu.
func (b *Budget) evict(q *queue) {
	last := q.ws[len(q.ws)-1]
	q.ws = q.ws[:len(q.ws)-1]
	b.waiters--
	last.evicted = true
	last.signal()
}

// Leave takes w out of every queue it joined through reqs, and tells the waiter now first in
// each to try: the room w waited for may be theirs. The requests are w's no longer.
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
		j := slices.Index(q.waiters(), w)
		if j < 0 {
			continue // a second request of the same budget and key
		}
		q.ws = slices.Delete(q.ws, j, j+1)
		b.waiters--
		switch {
		case len(q.ws) == 0:
			delete(b.queues, r.Key)
		case j == 0:
			q.ws[0].signal()
		}
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
		if bound == 0 || len(q.ws) <= bound {
			continue
		}
		if shed == nil {
			shed = map[string]shedRange{}
		}
		shed[key] = shedRange{from: q.ws[bound-1].seq, to: q.ws[len(q.ws)-1].seq}
	}
	return shed
}

// Waiting reports how many statements wait for key's room in b.
func (b *Budget) Waiting(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queues[key].waiters())
}

func (q *queue) waiters() []*Waiter {
	if q == nil {
		return nil
	}
	return q.ws
}

// queued is the denial of r while others wait for r's key before it: what the first waits
// for. nil when nobody waits or r's waiter is first. With connected set (r holds a connection
// and the key has pending slots: see check), only the waiters that hold a connection count.
// The caller holds b.mu.
func (b *Budget) queued(r *Request, connected bool) *Denial {
	q := b.queues[r.Key]
	if q == nil {
		return nil
	}
	first := q.ws[0]
	if connected {
		if first = q.firstConnected(); first == nil {
			return nil
		}
	}
	if first == r.Waiter {
		return nil
	}
	d := q.why
	d.Queued = true
	return &d
}

// firstConnected returns q's first waiter that holds a connection, or nil.
func (q *queue) firstConnected() *Waiter {
	for _, w := range q.waiters() {
		if w.connected {
			return w
		}
	}
	return nil
}

// noteWhy records d, the denial of the waiter first for r's key, as what those arriving behind
// it are told. The caller holds b.mu.
func (b *Budget) noteWhy(r *Request, d *Denial) {
	if q := b.queues[r.Key]; q != nil && q.ws[0] == r.Waiter {
		q.why = *d
		q.why.Index = 0
	}
}

// wakeFirst tells the first waiter for key, if any, to try again. The caller holds b.mu.
func (b *Budget) wakeFirst(key string) {
	if q := b.queues[key]; q != nil {
		q.ws[0].signal()
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
		for _, w := range q.ws {
			w.signal()
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
			b.queues[key].ws[0].signal()
		}
	}
}
