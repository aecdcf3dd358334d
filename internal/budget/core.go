package budget

import (
	"container/heap"
	"maps"
	"math"
	"slices"
	"time"
)

// maxCost caps costs so that an infinite prediction stays finite arithmetic
// (about 31 years of execution; it still exceeds any sane limit).
const maxCost = 1e9

// sanitizeCost maps NaN and negative costs to 0 and caps huge ones.
func sanitizeCost(c float64) float64 {
	switch {
	case !(c > 0):
		return 0
	case c > maxCost:
		return maxCost
	}
	return c
}

// withSlack is the burst limit plus a relative 1e-12, far below any
// measurable cost, so that float rounding (draining in several steps rather
// than one) cannot refuse a request at the instant its RetryAfter promised.
func withSlack(burst float64) float64 { return burst * (1 + 1e-12) }

// Bucket is a reverse leaky bucket: Debt execution seconds owed as of Last,
// drained when read at a rate the caller passes in. The zero value is an
// empty bucket. A Bucket is a plain value, not safe for concurrent use.
type Bucket struct {
	Debt float64
	Last time.Time
}

// DebtAt is the debt drained at rate to now; a now before Last drains nothing.
func (b Bucket) DebtAt(now time.Time, rate float64) float64 {
	return drain(b.Debt, rate, now.Sub(b.Last))
}

// drain is debt less rate × dt, never below zero; a dt <= 0 drains nothing.
func drain(debt, rate float64, dt time.Duration) float64 {
	if rate == 0 || dt <= 0 {
		return debt
	}
	if d := debt - rate*float64(dt)/1e9; d > 0 {
		return d
	}
	return 0
}

// Charge drains the bucket to now and adds delta (negative refunds), never
// leaving it below zero.
func (b *Bucket) Charge(now time.Time, rate, delta float64) {
	if rate == 0 {
		return
	}
	if dt := now.Sub(b.Last); dt > 0 {
		b.Debt, b.Last = drain(b.Debt, rate, dt), now
	}
	if b.Debt += delta; !(b.Debt > 0) { // also catches NaN
		b.Debt = 0
	}
}

// Fits reports whether cost fits under burst at now.
func (b Bucket) Fits(now time.Time, rate, burst, cost float64) bool {
	return b.DebtAt(now, rate)+cost <= withSlack(burst)
}

// RetryAfter is the shortest wait after now at which cost fits under burst,
// exact to the nanosecond: draining is monotone in time even in floating
// point, so a binary search finds the first instant that fits. The caller
// has checked that cost fits an empty bucket. A wait of more than [never]
// (a debt that a rate near zero drains in centuries) is never.
func (b Bucket) RetryAfter(now time.Time, rate, burst, cost float64) time.Duration {
	if rate == 0 || b.Fits(now, rate, burst, cost) {
		return 0
	}
	lo := time.Duration(0) // does not fit at now+lo
	hi := max(b.emptyAfter(now, rate), 1)
	for !b.Fits(now.Add(hi), rate, burst, cost) { // rounding put emptyAfter short
		if hi >= never {
			return never
		}
		hi = min(2*hi, never)
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if b.Fits(now.Add(mid), rate, burst, cost) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// emptyAfter is how long after now the debt reaches zero.
func (b Bucket) emptyAfter(now time.Time, rate float64) time.Duration {
	d := b.DebtAt(now, rate)
	if rate == 0 || d <= 0 {
		return 0
	}
	ns := math.Ceil(d / rate * 1e9)
	if ns >= float64(never) {
		return never
	}
	return time.Duration(ns)
}

// never is the longest wait the bucket computes, about 73 years: longer ones are never, and
// a time this far ahead still adds to any clock without overflow.
const never = time.Duration(math.MaxInt64 / 4)

// state is one key's bucket and concurrency count.
type state struct {
	Bucket
	key      string
	inflight int
	emptyAt  time.Time // when the debt is gone; the eviction order of idle states
	idx      int       // position in the idle heap; -1 while in flight (or the unkeyed state)
	part     *part     // a shared budget's partition (its lease and usage); nil in a local budget
	// pending is how many of the inflight slots are pending (Request.Pending): taken by
	// statements that have no connection yet, and pendingCost the cost they reserved. A
	// connected request is held only to the others, the running statements' slots and the debt
	// less pendingCost (Budget.check).
	pending     int
	pendingCost float64
	// meanHold is the EMA of the seconds the key's released statements held their slots: the
	// concurrency hint of a key whose statements are longer or shorter than the budget's other
	// keys' (a noisy tenant beside quiet ones). 0 until one was released.
	meanHold float64
}

// heldTo is what s holds r to: for a pending request every slot in flight and the whole debt;
// for a connected one (not Request.Pending) only the running statements' slots and their debt,
// not the slots and cost of statements waiting for a connection, perhaps the one r's statement
// holds. With nothing pending the two are the same.
func (s *state) heldTo(r *Request) (inflight int, debt float64) {
	if r.Pending || s.pending == 0 {
		return s.inflight, s.Debt
	}
	return s.inflight - s.pending, max(0, s.Debt-s.pendingCost)
}

// unpend takes a pending slot that reserved cost out of s's pending count, at its connection
// or its release.
func (s *state) unpend(cost float64) {
	s.pending--
	s.pendingCost -= cost
	if s.pending == 0 || s.pendingCost < 0 {
		s.pendingCost = 0 // no float residue once none is pending
	}
}

// keys is the single-threaded core of a [Budget]: the state of each key under
// one spec, bounded and evicted as the package doc's Keys section says.
type keys struct {
	spec     Spec
	unkeyed  *state
	byKey    map[string]*state
	idle     idleHeap
	inflight int // summed over keys
	evicted  uint64
	folds    uint64 // how many times fold moved the keys into the unkeyed state
	shared   bool   // limits come from each key's lease (lease.go), not from spec
	// provisional is a shared budget's lease for a key its coordinator has not leased yet
	// (lease.go): the limits of an absent key, and of a key inserted, until SetLease.
	provisional Lease
}

func (k *keys) lookup(key string) *state {
	if key == "" || k.spec.Keyless {
		return k.unkeyed
	}
	return k.byKey[key]
}

// holder is the state that holds admitted request r's slot: its key's, except for a keyed
// request admitted before the budget last folded its keys (fold, when it stopped counting per
// key), whose slot the unkeyed state has held since, also once the budget counts per key again.
func (k *keys) holder(r *Request) *state {
	if r.Key != "" && r.folds < k.folds {
		return k.unkeyed
	}
	return k.lookup(r.Key)
}

func (k *keys) count() int {
	n := len(k.byKey)
	if k.unkeyed != nil {
		n++
	}
	return n
}

// insert adds an absent key, evicting the first idle state if the table is
// full; a full table with nothing idle grows instead.
func (k *keys) insert(key string, now time.Time) *state {
	if k.spec.Keyless {
		key = ""
	}
	s := &state{key: key, idx: -1, Bucket: Bucket{Last: now}}
	if k.shared {
		s.part = &part{lease: k.provisional}
	}
	if key == "" {
		k.unkeyed = s
		return s
	}
	k.trim(k.spec.MaxKeys - 1)
	k.byKey[key] = s
	k.setIdle(s)
	return s
}

// trim evicts idle states until at most n keys remain or none is idle.
func (k *keys) trim(n int) {
	for len(k.byKey) > n && len(k.idle) > 0 {
		s := heap.Pop(&k.idle).(*state)
		delete(k.byKey, s.key)
		k.evicted++
	}
}

// take takes one slot of s, which is in flight from then on, so no longer idle.
func (k *keys) take(s *state) {
	if s.idx >= 0 {
		heap.Remove(&k.idle, s.idx)
	}
	s.inflight++
	k.inflight++
}

// give gives one slot of s back, whose bucket the caller has charged to now: a keyed state
// left with nothing in flight becomes idle (settle).
func (k *keys) give(s *state) {
	s.inflight--
	k.inflight--
	if s.inflight == 0 && s != k.unkeyed {
		k.settle(s)
	}
}

// settle puts s, keyed and with nothing in flight from now on, in the idle heap, and evicts idle
// states down to the table's bound (which it exceeds while more keys have queries in flight).
func (k *keys) settle(s *state) {
	k.setIdle(s)
	k.trim(k.spec.MaxKeys)
}

// adjust charges delta to s at now, after the statement it corrects was released. An idle s
// keeps its place in the idle heap, by its new empty time.
func (k *keys) adjust(s *state, now time.Time, delta float64) {
	s.Charge(now, k.rate(s), delta)
	if s.idx >= 0 {
		s.emptyAt = s.Last.Add(s.emptyAfter(s.Last, k.rate(s)))
		heap.Fix(&k.idle, s.idx)
	}
}

// setIdle puts s, which has nothing in flight, in the idle heap.
func (k *keys) setIdle(s *state) {
	s.emptyAt = s.Last.Add(s.emptyAfter(s.Last, k.rate(s)))
	heap.Push(&k.idle, s)
}

// setSpec switches to spec at now: debt accrued so far drains at the old
// rate up to now and at the new one after.
func (k *keys) setSpec(now time.Time, spec Spec) {
	for _, s := range k.all() {
		s.Charge(now, k.rate(s), 0)
		if spec.Rate == 0 {
			s.Debt = 0
		}
	}
	if spec.Keyless && !k.spec.Keyless {
		k.fold(now)
	}
	k.spec = spec
	k.provisional = k.bound(k.provisional)
	for _, s := range k.idle {
		s.emptyAt = s.Last.Add(s.emptyAfter(s.Last, k.rate(s)))
	}
	heap.Init(&k.idle)
	k.trim(spec.MaxKeys)
}

// fold moves every key's slots, pending slots and debt (drained to now) into the unkeyed
// state, which it creates if need be, and drops the keys: the budget counts per key no more.
func (k *keys) fold(now time.Time) {
	if len(k.byKey) == 0 {
		return
	}
	u := k.unkeyed
	if u == nil {
		u = k.insert("", now)
	}
	for key, s := range k.byKey {
		u.Debt += s.Debt
		u.inflight += s.inflight
		u.pending += s.pending
		u.pendingCost += s.pendingCost
		delete(k.byKey, key)
	}
	clear(k.idle) // only keyed states are idle
	k.idle = k.idle[:0]
	k.folds++ // the keyed requests admitted so far hold their slots in u (holder)
}

// all returns every state, the unkeyed one first.
func (k *keys) all() []*state {
	out := make([]*state, 0, k.count())
	if k.unkeyed != nil {
		out = append(out, k.unkeyed)
	}
	return slices.AppendSeq(out, maps.Values(k.byKey))
}

// idleHeap orders idle states by when their debt is gone (container/heap).
type idleHeap []*state

func (h idleHeap) Len() int           { return len(h) }
func (h idleHeap) Less(i, j int) bool { return h[i].emptyAt.Before(h[j].emptyAt) }
func (h idleHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *idleHeap) Push(x any) {
	s := x.(*state)
	s.idx = len(*h)
	*h = append(*h, s)
}
func (h *idleHeap) Pop() any {
	old := *h
	s := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	s.idx = -1
	return s
}
