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
	emptyAt  int64   // when debt reaches zero at the table's rate; the heap key while inflight == 0
	inflight int32
	idx      int32 // position in table.heap
}

// table is the single-threaded core of a [Budget]: a bounded map from key to
// state plus a min-heap that finds the eviction victim in O(1) and restores
// order in O(log n). Times are int64 nanoseconds on the owning budget's
// clock. The zero value is not usable; call newTable.
type table struct {
	rate    float64 // execution seconds drained per second; 0: no bucket, debt stays 0
	maxKeys int
	keys    map[string]*state
	heap    []heapEntry // min-heap on prio
	evicted uint64
}

func newTable(rate float64, maxKeys int) table {
	return table{rate: rate, maxKeys: maxKeys, keys: make(map[string]*state)}
}

func prio(s *state) int64 {
	if s.inflight > 0 {
		return inFlightPrio
	}
	return s.emptyAt
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

// drain brings s's debt up to t. emptyAt does not move: draining follows the
// line it was computed from.
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
	tb.setEmptyAt(s)
}

func (tb *table) setEmptyAt(s *state) {
	if tb.rate == 0 || s.debt <= 0 {
		s.emptyAt = s.last
		return
	}
	at := float64(s.last) + math.Ceil(s.debt/tb.rate*1e9)
	if at >= float64(maxEmptyAt) {
		s.emptyAt = maxEmptyAt
		return
	}
	s.emptyAt = int64(at)
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
	hi := s.emptyAt
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

// insert adds key at t with no debt and nothing in flight, first evicting if
// the table is full. A full table whose every state has a query in flight
// grows instead: evicting one would lose its concurrency count.
func (tb *table) insert(key string, t int64) *state {
	var s *state
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
	*s = state{key: key, last: t, emptyAt: t}
	tb.keys[key] = s
	tb.push(s)
	return s
}

// trim evicts until the table is within maxKeys or only in-flight states remain.
func (tb *table) trim() {
	for len(tb.keys) > tb.maxKeys && len(tb.heap) > 0 && tb.heap[0].at != inFlightPrio {
		victim := tb.heap[0].s
		tb.remove(0)
		delete(tb.keys, victim.key)
		tb.evicted++
	}
}

// setRate switches to a new drain rate at t: debt accrued so far drains at
// the old rate up to t and at the new one after, so a reload keeps every
// key's debt. O(n); reloads are rare.
func (tb *table) setRate(t int64, rate float64) {
	for _, e := range tb.heap {
		tb.drain(e.s, t)
	}
	tb.rate = rate
	for i, e := range tb.heap {
		if rate == 0 {
			e.s.debt = 0
		}
		tb.setEmptyAt(e.s)
		tb.heap[i].at = prio(e.s)
	}
	for i := len(tb.heap)/2 - 1; i >= 0; i-- {
		tb.down(i)
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

// reprio restores heap order after s's priority changed.
func (tb *table) reprio(s *state) {
	tb.heap[s.idx].at = prio(s)
	tb.fix(int(s.idx))
}

func (tb *table) push(s *state) {
	s.idx = int32(len(tb.heap))
	tb.heap = append(tb.heap, heapEntry{prio(s), s})
	tb.up(int(s.idx))
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
