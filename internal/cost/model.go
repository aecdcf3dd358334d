package cost

import (
	"cmp"
	"container/heap"
	"math"
	"sync"
	"sync/atomic"
)

// Defaults and model constants. The EMA weights are explained in the package documentation.
const (
	// DefaultMaxPatterns bounds the pattern table of a Model and the entries of a PlanCache.
	DefaultMaxPatterns = 10_000

	// DefaultGlobalK is the global k (execution seconds per planner cost unit) used before any
	// execution with a known plan cost has been observed. It was measured on PostgreSQL 15 with
	// the default cost settings (seq_page_cost=1, cpu_tuple_cost=0.01) on the project's 2-core
	// development machine, warm cache, no parallel workers: a seq scan of 2M rows costing 43,692
	// units took 146 ms (3.3e-6 s/unit), the same scan with a filter 170 ms for 43,746 units
	// (3.9e-6), a top-N sort 248 ms for 81,911 units (3.0e-6). Tiny plans take longer per unit
	// (a cost-8 index lookup takes ~0.2 ms, 2e-5 s/unit) because fixed per-statement overhead
	// dominates; the default follows the large plans, which are the ones budgets exist for.
	DefaultGlobalK = 3.5e-6

	// alphaPattern weighs each new execution of a pattern: the mean spans roughly the last ten
	// executions (weight of the 10th-newest sample 0.2·0.8^9 ≈ 0.03; older samples hold 0.8^10 ≈ 11%
	// in total), so k follows plan changes and table growth within a few runs yet one outlier moves
	// the mean by at most a fifth of its excess.
	alphaPattern = 0.2
	// alphaGlobal weighs each execution in the global k, a prior for patterns never seen before.
	// It spans roughly the last 200 executions of all patterns so that it reflects the workload
	// mix rather than the last statement.
	alphaGlobal = 0.01
	// alphaExplain weighs each EXPLAIN round trip: ~20 samples, as round trips vary with load.
	alphaExplain = 0.1

	// volatileCV is the coefficient of variation (standard deviation / mean of actual seconds)
	// above which a pattern's cost counts as varying widely.
	volatileCV = 0.5
	// volatileExplainRatio: per-call EXPLAIN pays off only when the pattern's mean cost is at least
	// this many EXPLAIN round trips (an order of magnitude), so the extra round trip costs under
	// 10% of the statement. 20 left range scans of a few milliseconds, whose cost swings most
	// with their arguments, on a stale plan cost (median error 0.9 on the accuracy benchmark).
	volatileExplainRatio = 10
	// volatileMinSamples keeps one or two early outliers from switching a pattern to per-call
	// EXPLAIN before its variance means anything.
	volatileMinSamples = 5
)

// Model predicts a statement's execution seconds from its planner cost and learns, per pattern,
// how planner cost translates into time on this server.
//
// For each pattern (fingerprint) it keeps exponential moving averages of actual execution
// seconds and of planner cost over the executions whose plan cost was known; their ratio is the
// pattern's k, and a prediction is planner cost × k. Patterns never observed with a plan cost use
// a global k: the ratio of slow EMAs of actual seconds and planner cost over all patterns (a ratio
// of averages, so expensive statements dominate it and cheap statements with large fixed overhead
// cannot inflate predictions for new expensive ones), or [DefaultGlobalK] before any history.
// It also tracks, per pattern, the EMA and exponentially weighted variance of actual seconds over
// all executions (for [Model.MeanActual] and [Model.Volatile]) and, globally, the mean EXPLAIN
// round trip.
//
// The pattern table is bounded: when full, training a new pattern evicts the least recently
// trained one. Only successful executions should be observed: a cancelled or failed execution's
// duration says nothing about the statement's cost.
//
// A Model is safe for concurrent use; the zero value is not usable, use [NewModel].
type Model struct {
	mu          sync.RWMutex // protects the fields below
	patterns    *lru[pattern]
	gActual     float64 // slow EMA of actual seconds over executions with a plan cost
	gPlan       float64 // slow EMA of their plan costs
	gN          uint64  // executions in the global EMAs
	explainMean float64 // EMA of EXPLAIN round-trip seconds
	explainN    uint64

	// gens version the state predictions are made from (see Gen): gens[i] counts the changes of
	// the patterns whose fingerprint maps to slot i (trained, or evicted), and every slot
	// counts the changes that may alter any pattern's prediction (an EXPLAIN round trip
	// recorded). They change only under mu's write lock and are read without it.
	gens [genSlots]atomic.Uint64
}

// genSlots is the number of pattern generation counters. Patterns share a counter when their
// fingerprints map to the same slot, which only makes a reused prediction expire early. A
// change of every pattern's state (a new EXPLAIN round trip) adds to all of them, about a
// microsecond against the EXPLAIN's round trip, so that a reader checks one counter.
const genSlots = 256

// Gen identifies the model state that a pattern's prediction was made from: while [Model.Gen]
// returns the same Gen for the pattern, a [Forecast] marked Stable still holds.
type Gen uint64

// Gen returns the current generation of pattern fp's state, without locking: one atomic load.
func (m *Model) Gen(fp uint64) Gen {
	return Gen(m.gens[fp%genSlots].Load())
}

// changedAll records a change of every pattern's state. The caller holds mu.
func (m *Model) changedAll() {
	for i := range m.gens {
		m.gens[i].Add(1)
	}
}

// Forecast is a prediction and what a caller needs to reuse it.
type Forecast struct {
	Seconds  float64 // what Predict returns: 0 when it cannot (OK false)
	OK       bool
	Volatile bool   // what Volatile returns
	Samples  uint64 // successful executions of the pattern observed (its Count)
	// Gen is the state the forecast was made from. A Stable forecast depends on nothing else,
	// so while Gen(fp) returns Gen it is what Forecast would return again for the same plan
	// cost. A forecast that used the global k (a pattern not yet observed with a plan cost) is
	// not Stable: the global k changes with every pattern's training.
	Gen    Gen
	Stable bool
}

// Forecast returns what [Model.Predict](fp, planCost) and [Model.Volatile](fp) return, from one
// consistent state under one read lock and one table lookup, with the generation it was made
// from, so that a caller can keep it and reuse it while [Model.Gen] is unchanged.
//
// It is the call for the decision path: the caller takes the cost cached by [PlanCache.Get] and
// predicts with it. Only when Volatile is true in explain mode auto (such a pattern is explained
// on every call), or when no cost was cached, does it run EXPLAIN and call [Model.Predict] again
// with the fresh cost.
func (m *Model) Forecast(fp uint64, planCost float64) Forecast {
	m.mu.RLock()
	p, _ := m.patterns.get(fp)
	var f Forecast
	f.Seconds, f.OK = m.predictLocked(p, planCost)
	f.Volatile = m.volatileLocked(p)
	f.Gen = m.Gen(fp) // under the read lock: no change can be under way
	if p != nil {
		f.Samples = p.n
		// predictLocked used only p's state, unless it fell back to the global k.
		f.Stable = p.nPlanned > 0 || !validPlan(planCost)
	}
	m.mu.RUnlock()
	return f
}

// pattern is the learned state of one fingerprint.
type pattern struct {
	n        uint64  // successful executions observed
	mean     float64 // EMA of actual seconds
	variance float64 // exponentially weighted variance of actual seconds
	nPlanned uint64  // executions observed with a plan cost
	actualP  float64 // EMA of actual seconds over those executions
	plan     float64 // EMA of their plan costs; > 0 when nPlanned > 0
	// buckets hold k per plan-cost range (a power of two): the same pattern's k differs by
	// plan shape and size (an index scan of 10 rows against a seq scan of 100k).
	buckets [costBuckets]costBucket
	// last is the index of the bucket trained most recently. A pattern's plan cost comes from
	// the plan cache, the same for a minute, so predictions and training keep hitting one range:
	// looking at this bucket first saves scanning all of them.
	last uint8
}

const (
	// costBuckets is how many plan-cost ranges one pattern keeps a k for; the least recently
	// trained range is replaced.
	costBuckets = 8
	// bucketSamples is how many recent per-execution k values a range keeps. Their median, not a
	// mean, is used: on a loaded server one slow execution would drag a mean for many executions.
	bucketSamples = 5
)

// costBucket is the recent k = actual / plan cost of one pattern's executions whose plan cost
// lies in [2^(exp-1), 2^exp).
type costBucket struct {
	exp  int32  // math.Frexp's exponent of the plan cost
	used uint32 // the pattern's nPlanned when last trained; 0 when the bucket is empty
	n    uint8  // samples held
	next uint8  // ring position of the next sample
	// med is median() of the samples, recomputed when one is added: a bucket is read by every
	// prediction and trained by one execution, and a prediction may run twice per execution
	// (explain mode auto predicts again after a per-call EXPLAIN), so predictions must not sort.
	med float64
	k   [bucketSamples]float64
}

// median returns the median of the samples held (the mean of the middle two for an even count),
// exactly as sortedMedian does.
//
// A full bucket (every bucket from its fifth sample on) selects the median with ten branch-free
// min and max operations instead of sorting. The least and the greatest of v0 to v3 cannot
// be the median unless another sample equals them (each lies on one side of three of the five),
// so the median of five is the median of v4 and the middle two of the four: lo and hi. The
// operations run on the bits: samples are >= 0 (+Inf included) or -0, and for numbers >= 0 the
// IEEE 754 encodings order as unsigned integers do, while integer min and max compile to
// conditional moves where float ones also handle NaN and signed zeros. Clearing the sign bit
// turns -0 into +0, the only sample it changes, so a nonzero median is bit for bit the sample
// the sort would pick; a zero one may be -0 or +0, and there the sort decides, keeping the sign
// that predictions always had.
func (b *costBucket) median() float64 {
	if b.n == bucketSamples {
		const sign = 1 << 63
		k := &b.k
		v0, v1, v2 := math.Float64bits(k[0])&^sign, math.Float64bits(k[1])&^sign, math.Float64bits(k[2])&^sign
		v3, v4 := math.Float64bits(k[3])&^sign, math.Float64bits(k[4])&^sign
		lo := max(min(v0, v1), min(v2, v3))
		hi := min(max(v0, v1), max(v2, v3))
		if m := max(min(v4, lo), min(max(v4, lo), hi)); m != 0 {
			return math.Float64frombits(m)
		}
	}
	return b.sortedMedian()
}

// sortedMedian is median by an insertion sort of the samples.
func (b *costBucket) sortedMedian() float64 {
	s := b.k // an array copy, not copy(): that calls memmove
	n := int(b.n)
	for i := 1; i < n; i++ { // insertion sort: n <= 5
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// bucketK returns the median recent k of planCost's range, else of the range above, else of the
// range below.
func (p *pattern) bucketK(planCost float64) (float64, bool) {
	e, ok := normalExp(planCost)
	if !ok {
		e = frexpExp(planCost) // a subnormal plan cost
	}
	exp := int32(e)
	// Trained buckets hold distinct ranges (observeBucket trains a range's bucket if it has one),
	// so a trained last bucket of planCost's range is the one the pass below would find.
	if b := &p.buckets[p.last%costBuckets]; b.used != 0 && b.exp == exp {
		return b.med, true
	}
	// One pass finds all three candidates, keeping the first trained bucket of each range in
	// slice order (observeBucket never trains two buckets for one range, but the first is what a
	// pass per range would find).
	var above, below *costBucket
	for i := range p.buckets {
		b := &p.buckets[i]
		if b.used == 0 {
			continue
		}
		switch b.exp {
		case exp:
			return b.med, true
		case exp + 1:
			if above == nil {
				above = b
			}
		case exp - 1:
			if below == nil {
				below = b
			}
		}
	}
	if above != nil {
		return above.med, true
	}
	if below != nil {
		return below.med, true
	}
	return 0, false
}

// normalExp returns the exponent that [math.Frexp] returns for x (x = frac × 2^exp with
// 0.5 <= |frac| < 1) when x is a normal number, as every plan cost PostgreSQL reports is: the
// biased exponent field minus 1022, read from the bits. It runs on every prediction and
// observation with a plan cost, where Frexp's call and normalisation were a tenth of the work.
// ok is false for zero, subnormals, infinities and NaN, whose exponent field is 0 or all ones:
// the caller then asks frexpExp. The fallback is the caller's so that this stays small enough
// to inline.
func normalExp(x float64) (exp int, ok bool) {
	const (
		mask  = 0x7ff // the 11 exponent bits, after shifting out the 52 mantissa bits
		shift = 52
		bias  = 1022 // IEEE 754's 1023, less one because frac is in [0.5, 1), not [1, 2)
	)
	e := math.Float64bits(x) >> shift & mask
	return int(e) - bias, e-1 < mask-1 // e-1 wraps around for e = 0: one comparison rejects both
}

// frexpExp returns the exponent that [math.Frexp] returns for x.
func frexpExp(x float64) int {
	if exp, ok := normalExp(x); ok {
		return exp
	}
	_, exp := math.Frexp(x)
	return exp
}

// observeBucket adds the sample k = actual / planCost to the bucket of planCost's range.
func (p *pattern) observeBucket(planCost, actual float64) {
	e, ok := normalExp(planCost)
	if !ok {
		e = frexpExp(planCost) // a subnormal plan cost
	}
	exp := int32(e)
	// As in bucketK: a trained last bucket of this range is the one bucketFor would return.
	i := p.last % costBuckets
	if b := &p.buckets[i]; b.used == 0 || b.exp != exp {
		i = p.bucketFor(exp)
	}
	b := &p.buckets[i]
	p.last = i
	b.used = uint32(p.nPlanned)
	b.k[b.next] = actual / planCost
	if b.next++; b.next == bucketSamples {
		b.next = 0
	}
	b.n = min(b.n+1, bucketSamples)
	b.med = b.median()
}

// bucketFor returns the index of the trained bucket of range exp, or else empties the first empty
// or least recently trained bucket for the range and returns its index.
func (p *pattern) bucketFor(exp int32) uint8 {
	j := -1
	for i := range p.buckets {
		c := &p.buckets[i]
		if c.used != 0 && c.exp == exp {
			return uint8(i)
		}
		if j < 0 || c.used < p.buckets[j].used {
			j = i
		}
	}
	p.buckets[j] = costBucket{exp: exp}
	return uint8(j)
}

// NewModel returns a Model holding at most maxPatterns patterns ([DefaultMaxPatterns] if
// maxPatterns <= 0).
func NewModel(maxPatterns int) *Model {
	return &Model{patterns: newLRU[pattern](boundOrDefault(maxPatterns))}
}

func boundOrDefault(n int) int {
	if n <= 0 {
		return DefaultMaxPatterns
	}
	return min(n, math.MaxInt32)
}

// Predict returns the predicted execution seconds of one execution of pattern fp whose planner
// cost is planCost: planCost × [Model.K]. A planCost <= 0 (or not finite) means no plan is known:
// the prediction is then the pattern's mean actual time, and ok is false for a pattern with no
// history.
func (m *Model) Predict(fp uint64, planCost float64) (seconds float64, ok bool) {
	m.mu.RLock()
	p, _ := m.patterns.get(fp)
	seconds, ok = m.predictLocked(p, planCost)
	m.mu.RUnlock() // not deferred: nothing between lock and unlock can panic, and this is hot
	return seconds, ok
}

// predictLocked is Predict for pattern p (nil when the pattern is not in the table).
func (m *Model) predictLocked(p *pattern, planCost float64) (float64, bool) {
	if validPlan(planCost) {
		if p != nil && p.nPlanned > 0 {
			if k, ok := p.bucketK(planCost); ok {
				return planCost * k, true
			}
			return planCost * (p.actualP / p.plan), true
		}
		return planCost * m.globalKLocked(), true
	}
	if p != nil && p.n > 0 {
		return p.mean, true
	}
	return 0, false
}

// Observe trains the model on one successful execution of pattern fp that took actual seconds,
// with planner cost planCost (0 if none was known). Samples with a negative or non-finite actual
// time are ignored.
func (m *Model) Observe(fp uint64, planCost, actual float64) {
	if !(actual >= 0) || math.IsInf(actual, 0) { // also rejects NaN
		return
	}
	planned := validPlan(planCost)
	m.mu.Lock()
	if m.patterns.len() == m.patterns.max {
		// Training a new pattern evicts the least recently trained one, whose predictions fall
		// back to the global k: its counter changes too.
		if _, known := m.patterns.get(fp); !known {
			m.gens[m.patterns.tailKey()%genSlots].Add(1)
		}
	}
	p, _ := m.patterns.put(fp) // the one table lookup: everything below updates p in place
	m.gens[fp%genSlots].Add(1)
	p.n++
	if p.n == 1 {
		// Seed the averages with the first sample rather than decaying from zero, which would
		// under-predict a new pattern for its first several executions.
		p.mean, p.variance = actual, 0
	} else {
		d := actual - p.mean
		p.mean += alphaPattern * d
		p.variance = (1 - alphaPattern) * (p.variance + alphaPattern*d*d)
	}
	if planned {
		p.nPlanned++
		p.actualP = ema(p.actualP, actual, alphaPattern, p.nPlanned)
		p.plan = ema(p.plan, planCost, alphaPattern, p.nPlanned)
		p.observeBucket(planCost, actual)
		m.gN++
		m.gActual = ema(m.gActual, actual, alphaGlobal, m.gN)
		m.gPlan = ema(m.gPlan, planCost, alphaGlobal, m.gN)
	}
	m.mu.Unlock() // not deferred: nothing under the lock can panic, and this runs per statement
}

// ema returns the average avg updated with sample x; n counts samples including x.
func ema(avg, x, alpha float64, n uint64) float64 {
	if n == 1 {
		return x
	}
	return avg + alpha*(x-avg)
}

func validPlan(c float64) bool { return c > 0 && !math.IsInf(c, 0) }

// MeanActual returns the pattern's mean actual execution seconds (its EMA), the history-only
// baseline used when no plan cost is known; ok is false for a pattern with no history.
func (m *Model) MeanActual(fp uint64) (float64, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if p, ok := m.patterns.get(fp); ok && p.n > 0 {
		return p.mean, true
	}
	return 0, false
}

// K returns the factor, in execution seconds per planner cost unit, that [Model.Predict] applies
// to pattern fp: the pattern's own once it has been observed with a plan cost, else the global k.
func (m *Model) K(fp uint64) float64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if p, ok := m.patterns.get(fp); ok && p.nPlanned > 0 {
		return p.actualP / p.plan
	}
	return m.globalKLocked()
}

// GlobalK returns the factor used for patterns with no plan history.
func (m *Model) GlobalK() float64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.globalKLocked()
}

func (m *Model) globalKLocked() float64 {
	if m.gN == 0 {
		return DefaultGlobalK
	}
	return m.gActual / m.gPlan
}

// Volatile reports whether, in explain mode auto, pattern fp should be explained on every call
// rather than once per pattern: its actual cost varies widely (coefficient of variation above 0.5
// over at least 5 executions) and its mean dwarfs an EXPLAIN round trip (more than 10 × the mean
// round trip recorded by [Model.ObserveExplain]; false before any round trip was recorded).
func (m *Model) Volatile(fp uint64) bool {
	m.mu.RLock()
	p, _ := m.patterns.get(fp)
	v := m.volatileLocked(p)
	m.mu.RUnlock()
	return v
}

// volatileLocked is Volatile for pattern p (nil when the pattern is not in the table).
func (m *Model) volatileLocked(p *pattern) bool {
	if p == nil || p.n < volatileMinSamples || m.explainN == 0 {
		return false
	}
	return p.mean > volatileExplainRatio*m.explainMean && math.Sqrt(p.variance) > volatileCV*p.mean
}

// ObserveExplain records the duration of one EXPLAIN round trip, in seconds. Negative or
// non-finite durations are ignored.
func (m *Model) ObserveExplain(seconds float64) {
	if !(seconds >= 0) || math.IsInf(seconds, 0) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.changedAll() // the round-trip mean decides Volatile
	m.explainN++
	m.explainMean = ema(m.explainMean, seconds, alphaExplain, m.explainN)
}

// ExplainMean returns the mean EXPLAIN round trip in seconds; ok is false before any was recorded.
func (m *Model) ExplainMean() (seconds float64, ok bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.explainMean, m.explainN > 0
}

// Len returns the number of patterns in the table.
func (m *Model) Len() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.patterns.len()
}

// PatternStats describes one pattern's learned state, for introspection.
type PatternStats struct {
	Fingerprint uint64
	// Count is the number of successful executions observed since the pattern entered the table.
	Count uint64
	// MeanActual and StdDevActual are the EMA and exponentially weighted standard deviation of
	// actual execution seconds.
	MeanActual   float64
	StdDevActual float64
	// MeanPlanCost is the EMA of planner cost; 0 when the pattern was never observed with one.
	MeanPlanCost float64
	// K is the factor in use (the pattern's, or the global one), seconds per planner cost unit.
	K float64
}

// Top returns the n patterns with the most observed executions, most first (ties by
// fingerprint), or nil when n <= 0.
func (m *Model) Top(n int) []PatternStats {
	if n <= 0 {
		return nil
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	// A min-heap of the n best so far keeps this O(patterns × log n) and the allocation at n.
	h := make(statsHeap, 0, min(n, m.patterns.len()))
	gk := m.globalKLocked()
	m.patterns.each(func(fp uint64, p *pattern) {
		s := PatternStats{Fingerprint: fp, Count: p.n}
		if len(h) == n && !statsLess(h[0], s) {
			return
		}
		s.MeanActual = p.mean
		s.StdDevActual = math.Sqrt(p.variance)
		s.K = gk
		if p.nPlanned > 0 {
			s.MeanPlanCost = p.plan
			s.K = p.actualP / p.plan
		}
		if len(h) < n {
			heap.Push(&h, s)
		} else {
			h[0] = s
			heap.Fix(&h, 0)
		}
	})
	out := make([]PatternStats, len(h))
	for i := len(out) - 1; i >= 0; i-- {
		out[i] = heap.Pop(&h).(PatternStats)
	}
	return out
}

// statsLess orders patterns from least to most hot: by count, then by descending fingerprint so
// that the smaller fingerprint wins a tie.
func statsLess(a, b PatternStats) bool {
	if a.Count != b.Count {
		return a.Count < b.Count
	}
	return cmp.Less(b.Fingerprint, a.Fingerprint)
}

type statsHeap []PatternStats

func (h statsHeap) Len() int           { return len(h) }
func (h statsHeap) Less(i, j int) bool { return statsLess(h[i], h[j]) }
func (h statsHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *statsHeap) Push(x any)        { *h = append(*h, x.(PatternStats)) }
func (h *statsHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
