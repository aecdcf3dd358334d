package budget

import "math"

// inFlightPrio orders states with a query in flight after every other state,
// so that eviction reaches them last (and then refuses: see table.insert).
const inFlightPrio = math.MaxInt64

// maxEmptyAt caps emptyAt below inFlightPrio; about 285 years of nanoseconds.
const maxEmptyAt = int64(9e18)

// withSlack is the burst limit plus a relative 1e-12, far below any
// measurable cost, so that float rounding (draining in several steps rather
// than one) cannot refuse a request at the instant its RetryAfter promised.
func withSlack(burst float64) float64 { return burst * (1 + 1e-12) }

// state is one key's bucket and concurrency count.
type state struct {
	key      string
	debt     float64 // execution seconds owed as of last
	last     int64   // when debt was last drained, budget-relative nanoseconds
	inflight int32
	idx      int32 // position in table.heap; -1 for the unkeyed state, which is in no heap
}

// table is the single-threaded core of a [Budget]: a bounded map from key to
// state plus a min-heap that finds the eviction victim in O(1) and restores
// order in O(log n). Times are int64 nanoseconds on the owning budget's
// clock. The zero value is not usable; call newTable.
//
// Heap order only matters when a state must be evicted, which needs the
// table full (len(keys) >= maxKeys). Below that bound, where most tables
// spend their life, every admission and release would sift a state to a leaf
// and back for nothing; so there the heap is left stale (priorities and
// order out of date; membership and idx always exact) and rebuilt in O(n)
// when an insert fills the table. Invariant: stale implies len(keys) <
// maxKeys, so every eviction reads an exact heap. A table stays full once
// full (an eviction is always followed by the insert that caused it, and
// trim stops at the bound) until a reload, so a rebuild is paid when the
// table first fills (after one insert per state) and at most once after each
// reload (itself O(n)).
//
// The state of the empty key "" (every query of a budget without a `per`
// tag) is kept apart, in unkeyed: it is in neither the map nor the heap, so
// the most common admission hashes no string and sifts no heap. It is never
// evicted and does not count against maxKeys: it is one fixed-size state,
// and evicting it would only forget debt. A keyed budget that also sees ""
// (a query without its tag) may thus hold maxKeys+1 states.
type table struct {
	rate       float64 // execution seconds drained per second; 0: no bucket, debt stays 0
	unkeyed    state   // the state of key ""; valid only if hasUnkeyed (next to rate: read together)
	hasUnkeyed bool    // "" has been admitted: unkeyed is one of the table's states
	maxKeys    int
	keys       map[string]*state // every key but ""
	heap       []heapEntry       // exactly the states in keys; a min-heap on prio unless stale
	stale      bool              // heap order and priorities may be out of date; see above
	evicted    uint64
}

func newTable(rate float64, maxKeys int) table {
	return table{rate: rate, maxKeys: maxKeys, keys: make(map[string]*state)}
}

// prio is s's eviction priority: when its debt reaches zero (emptyAt), or last of all while it
// has a query in flight.
func (tb *table) prio(s *state) int64 {
	if s.inflight > 0 {
		return inFlightPrio
	}
	return tb.emptyAt(s)
}

// debtAt is s's debt drained to t, without changing s.
func (tb *table) debtAt(s *state, t int64) float64 {
	if tb.rate == 0 || t <= s.last {
		return s.debt
	}
	d := s.debt - tb.rate*(float64(t-s.last)/1e9)
	if d < 0 {
		return 0
	}
	return d
}

// drain brings s's debt up to t.
func (tb *table) drain(s *state, t int64) {
	s.debt = tb.debtAt(s, t)
	if t > s.last {
		s.last = t
	}
}

// charge drains s to t and adds delta (negative refunds), never below zero.
// The caller calls reprio if s's priority changed.
func (tb *table) charge(s *state, t int64, delta float64) {
	if tb.rate == 0 {
		return
	}
	tb.drain(s, t)
	s.debt += delta
	if !(s.debt > 0) { // also catches NaN
		s.debt = 0
	}
}

// emptyAt is when s's debt reaches zero at the table's rate, from its debt at last: the eviction
// priority of a state with nothing in flight. It is computed when the heap needs it rather than
// kept in the state, so that the common admission and release, which leave the heap alone (a
// state in flight, the unkeyed state, a table below its bound), skip the division.
func (tb *table) emptyAt(s *state) int64 {
	if tb.rate == 0 || s.debt <= 0 {
		return s.last
	}
	at := float64(s.last) + math.Ceil(s.debt/tb.rate*1e9)
	if at >= float64(maxEmptyAt) {
		return maxEmptyAt
	}
	return int64(at)
}

// fitsAt reports whether cost (plus extra already asked for by the same
// admission) fits in s's bucket at t. s may be nil: an absent key is empty.
func (tb *table) fitsAt(s *state, t int64, cost, burst float64) bool {
	d := 0.0
	if s != nil {
		d = tb.debtAt(s, t)
	}
	return d+cost <= withSlack(burst)
}

// fitTime is the earliest time >= t at which cost fits, found by binary
// search over nanoseconds: draining is monotone in time even in floating
// point, so the answer is exact for the same state (fits at the result, not
// one nanosecond before). The caller has checked that cost <= burst.
func (tb *table) fitTime(s *state, t int64, cost, burst float64) int64 {
	if s == nil || tb.fitsAt(s, t, cost, burst) {
		return t
	}
	lo := max(t, s.last) // does not fit at lo
	hi := tb.emptyAt(s)
	if hi <= lo {
		hi = lo + 1
	}
	for !tb.fitsAt(s, hi, cost, burst) { // only if rounding put emptyAt short
		if hi >= maxEmptyAt {
			return maxEmptyAt
		}
		hi += max(1, hi-lo)
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if tb.fitsAt(s, mid, cost, burst) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// lookup returns key's state, or nil if the table has none.
func (tb *table) lookup(key string) *state {
	if key == "" {
		if tb.hasUnkeyed {
			return &tb.unkeyed
		}
		return nil
	}
	return tb.keys[key]
}

// owns reports whether s is key's state in tb, i.e. whether s is what
// lookup(key) would return, in O(1) and without hashing key. s may be any
// state, including one of another table, one evicted since it was looked up
// (its fields are stale) or one since reused for another key.
//
// A keyed state is in tb exactly when it is in tb's heap, and its idx is kept
// equal to its position there, so heap[s.idx].s == s proves membership (a
// state of another table, or an evicted one, fails it: idx out of range or
// another state at that position); a member's key field is its map key. The
// unkeyed state is owned only as tb's own field.
func (tb *table) owns(s *state, key string) bool {
	if key == "" {
		return s == &tb.unkeyed && tb.hasUnkeyed
	}
	i := uint(s.idx)
	return i < uint(len(tb.heap)) && tb.heap[i].s == s && s.key == key
}

// count is the number of states held, "" included.
func (tb *table) count() int {
	n := len(tb.keys)
	if tb.hasUnkeyed {
		n++
	}
	return n
}

// insert adds key (absent) at t with no debt and nothing in flight, first
// evicting if the table is full. A full table whose every state has a query
// in flight grows instead: evicting one would lose its concurrency count.
func (tb *table) insert(key string, t int64) *state {
	if key == "" {
		tb.unkeyed = state{last: t, idx: -1}
		tb.hasUnkeyed = true
		return &tb.unkeyed
	}
	var s *state
	// A full table is never stale: heap[0] is the exact victim.
	for len(tb.keys) >= tb.maxKeys && len(tb.heap) > 0 && tb.heap[0].at != inFlightPrio {
		victim := tb.heap[0].s
		tb.remove(0)
		delete(tb.keys, victim.key)
		tb.evicted++
		s = victim // reused, so that key churn does not allocate
	}
	if s == nil {
		s = new(state)
	}
	*s = state{key: key, last: t}
	tb.keys[key] = s
	tb.push(s)
	return s
}

// trim evicts until the table is within maxKeys or only in-flight states
// remain. A table over its bound is never stale. It is split so that the
// common call, within the bound, inlines to one comparison.
func (tb *table) trim() {
	if len(tb.keys) > tb.maxKeys {
		tb.trimOver()
	}
}

func (tb *table) trimOver() {
	for len(tb.keys) > tb.maxKeys && len(tb.heap) > 0 && tb.heap[0].at != inFlightPrio {
		victim := tb.heap[0].s
		tb.remove(0)
		delete(tb.keys, victim.key)
		tb.evicted++
	}
}

// setRate switches to a new drain rate at t: debt accrued so far drains at
// the old rate up to t and at the new one after, so a reload keeps every
// key's debt. It leaves the heap exact. O(n); reloads are rare.
func (tb *table) setRate(t int64, rate float64) {
	for _, e := range tb.heap {
		tb.drain(e.s, t)
	}
	if tb.hasUnkeyed {
		tb.drain(&tb.unkeyed, t)
	}
	tb.rate = rate
	if tb.hasUnkeyed {
		tb.rebase(&tb.unkeyed)
	}
	for _, e := range tb.heap {
		tb.rebase(e.s)
	}
	tb.rebuild()
}

// rebuild makes the heap exact: every priority recomputed, then heapified.
// O(n).
func (tb *table) rebuild() {
	for i, e := range tb.heap {
		tb.heap[i].at = tb.prio(e.s)
	}
	for i := len(tb.heap)/2 - 1; i >= 0; i-- {
		tb.down(i)
	}
	tb.stale = false
}

// rebase drops s's debt after a change of rate if the bucket is gone.
func (tb *table) rebase(s *state) {
	if tb.rate == 0 {
		s.debt = 0
	}
}

// Heap primitives, hand-written rather than container/heap so that nothing
// is boxed in an interface on the hot path. Entries carry their priority so
// that sifting compares without touching the states.

// heapEntry is one state in the eviction heap.
type heapEntry struct {
	at int64 // prio(s) when last set; kept equal by reprio
	s  *state
}

// reprio restores heap order after s's priority changed, or below the
// bound leaves the heap stale. s must not be the unkeyed state, which is in
// no heap. It is split so that the stale case inlines.
func (tb *table) reprio(s *state) {
	if len(tb.keys) < tb.maxKeys {
		tb.stale = true
		return
	}
	tb.resift(s)
}

func (tb *table) resift(s *state) {
	tb.heap[s.idx].at = tb.prio(s)
	tb.fix(int(s.idx))
}

// push adds s, already in keys, to the heap: in order if that fills the
// table, else appended (stale).
func (tb *table) push(s *state) {
	s.idx = int32(len(tb.heap))
	tb.heap = append(tb.heap, heapEntry{tb.prio(s), s})
	switch {
	case len(tb.keys) < tb.maxKeys:
		tb.stale = true
	case tb.stale:
		tb.rebuild() // this insert filled the table: evictions may follow
	default:
		tb.up(int(s.idx))
	}
}

func (tb *table) remove(i int) {
	last := len(tb.heap) - 1
	if i != last {
		tb.swap(i, last)
	}
	tb.heap[last] = heapEntry{}
	tb.heap = tb.heap[:last]
	if i != last {
		tb.fix(i)
	}
}

func (tb *table) fix(i int) {
	if !tb.down(i) {
		tb.up(i)
	}
}

func (tb *table) swap(i, j int) {
	h := tb.heap
	h[i], h[j] = h[j], h[i]
	h[i].s.idx = int32(i)
	h[j].s.idx = int32(j)
}

func (tb *table) up(i int) {
	h := tb.heap
	for i > 0 {
		p := (i - 1) / 2
		if h[p].at <= h[i].at {
			return
		}
		tb.swap(i, p)
		i = p
	}
}

// down sifts i towards the leaves and reports whether it moved.
func (tb *table) down(i0 int) bool {
	h := tb.heap
	i, n := i0, len(h)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && h[r].at < h[l].at {
			c = r
		}
		if h[c].at >= h[i].at {
			break
		}
		tb.swap(i, c)
		i = c
	}
	return i > i0
}
