package cost

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Model constants. The EMA weights are explained in the package documentation.
const (
	// PlanTTL is how long a pattern's cached plan cost stays valid at most: long enough that a
	// hot pattern is explained about once a minute, short enough to follow table growth and
	// fresh statistics. Each pattern's is a little shorter, by its fingerprint (PlanTTLOf).
	PlanTTL = 60 * time.Second

	// DefaultGlobalK is the global k (execution seconds per planner cost unit) used before any
	// execution with a known plan cost has been observed: measured with PostgreSQL 15's default
	// cost settings on large sequential scans and sorts, the plans budgets exist for (tiny plans
	// take longer per unit: fixed per-statement overhead dominates them). The measurements are
	// in integration/PERFORMANCE.md.
	DefaultGlobalK = 3.5e-6

	// Relearn is how often a pattern that budgets refuse because its prediction exceeds a
	// limit (per_query_limit, or a burst it can never fit) runs one statement as a probe
	// ([Model.NeverFits]): often enough that a prediction inflated by a slow start (a cold cache,
	// a client measuring under its own load) is corrected within seconds, rarely enough that a
	// pattern that really costs too much, its probe cut off at the limit, costs its budget a
	// small part of its share.
	Relearn = 10 * time.Second

	alphaPattern = 0.2  // a pattern's EMAs
	alphaGlobal  = 0.01 // the global k
	alphaExplain = 0.1  // the EXPLAIN round trip

	// minGlobalPlan is the smallest planner cost whose executions teach the global k. A smaller
	// plan's time is mostly the statement's fixed cost (a round trip, parsing, the client), not
	// its plan: trivial statements would teach a k thousands of times the default and price a
	// new pattern of a modest plan as seconds long (integration/PERFORMANCE.md). From a thousand
	// units the plan's own time dominates.
	minGlobalPlan = 1000

	// globalPrior is how many executions of a plan of minGlobalPlan or more the global k takes
	// to be learned alone: before, DefaultGlobalK stands in for those not yet seen.
	globalPrior = 10

	// volatileCV is the coefficient of variation (standard deviation / mean of actual seconds)
	// above which a pattern's cost counts as varying widely.
	volatileCV = 0.5
	// volatileExplainRatio: per-call EXPLAIN pays off only when the pattern's mean cost is at least
	// this many EXPLAIN round trips (an order of magnitude), so the extra round trip is small
	// against the statement. A larger ratio left range scans of a few milliseconds, whose cost
	// swings most with their arguments, on a stale plan cost.
	volatileExplainRatio = 10
	// volatileMinSamples keeps one or two early outliers from switching a pattern to per-call
	// EXPLAIN before its variance means anything.
	volatileMinSamples = 5
)

// Model predicts a statement's execution seconds from its planner cost and learns, per pattern,
// how planner cost translates into time on this server, as the package documentation describes.
// Only successful executions should be observed.
//
// A Model is safe for concurrent use: one lock guards its state. The zero value is not usable,
// use [NewModel].
type Model struct {
	mu          sync.RWMutex // protects the fields below
	patterns    *lru[pattern]
	gActual     float64 // slow EMA of actual seconds over executions with a plan cost of minGlobalPlan or more
	gPlan       float64 // slow EMA of their plan costs
	gN          uint64  // executions in the global EMAs
	explainMean float64 // EMA of EXPLAIN round-trip seconds
	explainN    uint64

	unidentified atomic.Uint64 // EXPLAINs that reported no query identifier (PutQueryID of 0)
}

// Plan is what an EXPLAIN tells of one statement.
type Plan struct {
	Cost float64 // the plan's total cost, in planner units
	// QueryID is the server's query identifier of the statement, the key of its counters in
	// pg_stat_statements; 0 when the server computes none (compute_query_id off, before
	// PostgreSQL 14).
	QueryID int64
}

// Prediction is what the model expects of one execution.
type Prediction struct {
	Seconds float64 // predicted execution seconds; 0 when the model cannot predict (OK false)
	OK      bool
	// Server reports that Seconds is on the server's clock: learned from what the server
	// reported it spent on the pattern ([Model.ObserveServer]), not from the client's
	// measurements.
	Server bool
	// Volatile reports that, in explain mode auto, the pattern should be explained on every call
	// rather than once per pattern: its actual cost varies widely (coefficient of variation above
	// 0.5 over at least 5 executions) and its mean dwarfs an EXPLAIN round trip (more than 10 ×
	// the mean round trip recorded by [Model.ObserveExplain]; false before any was recorded).
	Volatile bool
	Samples  uint64  // successful executions of the pattern observed
	PlanCost float64 // the planner cost the prediction used; 0 when none
	// Identified reports that the server's query identifier of the pattern is known
	// ([Model.PutQueryID]): the server can report what its statements cost.
	Identified bool
	Cached     bool // PlanCost is the pattern's cached plan cost (see Model.PutPlan)
}

// pattern is the learned state of one fingerprint.
type pattern struct {
	n        uint64  // successful executions observed
	runs     uint64  // successful executions the observed ones stand for (Observe's weight)
	mean     float64 // EMA of actual seconds
	variance float64 // exponentially weighted variance of actual seconds
	nPlanned uint64  // executions observed with a plan cost
	actualP  float64 // EMA of actual seconds over those executions
	plan     float64 // EMA of their plan costs; > 0 when nPlanned > 0
	// buckets hold the recent k of each plan-cost range, as one pattern's k differs by plan size.
	buckets [costBuckets]costBucket
	// cachedPairs: some executions in the plan history were priced by the pattern's cached
	// plan cost rather than their own (Observe's own false).
	cachedPairs bool
	// planCost is the planner cost of the pattern's last EXPLAIN, valid until planExpires.
	planCost    float64
	planExpires time.Time
	// planSeconds and planOK are the prediction for planCost, worked out when it or the pattern's
	// training changes rather than per statement, as costBucket.med is (for a pattern without a
	// k of its own, it uses the global k of that moment).
	planSeconds float64
	planOK      bool
	// queryID is the server's query identifier from the pattern's last EXPLAIN that reported
	// one; 0: none.
	queryID int64
	// serverMean is the server's mean execution seconds of the pattern as its last report
	// gave it (ObserveServer), used until serverUntil; planServer is the prediction for planCost on the
	// server's clock, worked out as planSeconds is.
	serverMean  float64
	serverUntil time.Time
	planServer  float64
	// refused is when budgets first refused the pattern because its prediction exceeds a limit,
	// since its last observed execution (zero: not refused so); probed is when its last probe
	// was handed out (NeverFits).
	refused, probed time.Time
	// text is the pattern's normalised text as Observe or PutQueryID was first given it, for
	// introspection (Top): the model never reads it, and keeps it as long as the pattern's
	// statistics, which the caller's own caches may evict sooner.
	text string
}

const (
	// costBuckets is how many plan-cost ranges one pattern keeps a k for; the least recently
	// trained range is replaced.
	costBuckets = 8
	// bucketSamples is how many recent per-execution k values a range keeps for its median.
	bucketSamples = 5
)

// costBucket is the recent k = actual / plan cost of one pattern's executions whose plan cost
// lies in [2^exp, 2^(exp+1)).
type costBucket struct {
	exp  int
	used uint64  // the pattern's nPlanned when last trained; 0 when the bucket is empty
	n    int     // samples held
	next int     // ring position of the next sample
	med  float64 // median of the samples, kept at training so that predictions do not sort
	k    [bucketSamples]float64
}

// median returns the median of the samples held (the mean of the middle two for an even count).
func (b *costBucket) median() float64 {
	s := b.k
	v := s[:b.n]
	slices.Sort(v)
	if b.n%2 == 1 {
		return v[b.n/2]
	}
	return (v[b.n/2-1] + v[b.n/2]) / 2
}

// bucketK returns the median recent k of planCost's range or of a neighbouring one, whichever
// holds the most samples (on a tie planCost's own, then the range above, then below): a range
// the pattern has just grown into (its table doubled) holds a run or two, whose "median" is
// that run alone, and one slow run there (a caller reading its rows slowly) must not outweigh
// the neighbouring range's full history.
func (p *pattern) bucketK(planCost float64) (float64, bool) {
	exp := math.Ilogb(planCost)
	var best *costBucket
	for _, e := range [...]int{exp, exp + 1, exp - 1} {
		for i := range p.buckets {
			if b := &p.buckets[i]; b.used != 0 && b.exp == e && (best == nil || b.n > best.n) {
				best = b
			}
		}
	}
	if best == nil {
		return 0, false
	}
	return best.med, true
}

// forgetPlans drops what p learned of its plan costs (its k), keeping its mean time.
func (p *pattern) forgetPlans() {
	p.nPlanned, p.actualP, p.plan, p.cachedPairs = 0, 0, 0, false
	p.buckets = [costBuckets]costBucket{}
}

// observeBucket adds the sample k = actual / planCost to the bucket of planCost's range,
// replacing the least recently trained range if it has none.
func (p *pattern) observeBucket(planCost, actual float64) {
	exp := math.Ilogb(planCost)
	j := -1
	for i := range p.buckets {
		c := &p.buckets[i]
		if c.used != 0 && c.exp == exp {
			j = i
			break
		}
		if j < 0 || c.used < p.buckets[j].used {
			j = i
		}
	}
	b := &p.buckets[j]
	if b.used == 0 || b.exp != exp {
		*b = costBucket{exp: exp}
	}
	b.used = p.nPlanned
	b.k[b.next] = actual / planCost
	b.next = (b.next + 1) % bucketSamples
	b.n = min(b.n+1, bucketSamples)
	b.med = b.median()
}

// NewModel returns a Model holding at most maxPatterns patterns (at least one). The engine sizes
// it as its pattern cache.
func NewModel(maxPatterns int) *Model {
	return &Model{patterns: newLRU[pattern](min(max(maxPatterns, 1), math.MaxInt32))}
}

// Predict returns what the model expects at now of one execution of pattern fp whose planner
// cost is planCost: planCost × the pattern's k (see [Model]). A planCost of 0 (no EXPLAIN of
// this execution) uses the pattern's cached plan cost while it is fresh (Cached); with neither,
// the prediction is the pattern's mean actual time, and OK is false for a pattern with no
// history. A time before the plan cost was put (a wall-clock step in a caller's clock) counts as
// fresh.
func (m *Model) Predict(now time.Time, fp uint64, planCost float64) (r Prediction) {
	m.mu.RLock()
	p, _ := m.patterns.get(fp)
	if p != nil {
		r.Samples, r.Identified = p.n, p.queryID != 0
		if r.Cached = !validPlan(planCost) && now.Before(p.planExpires); r.Cached {
			planCost = p.planCost
		}
	}
	if validPlan(planCost) {
		r.PlanCost = planCost
	}
	switch {
	case p != nil && now.Before(p.serverUntil):
		r.Server, r.OK = true, true
		if r.Cached {
			r.Seconds = p.planServer
		} else {
			r.Seconds = p.serverSeconds(planCost)
		}
	case r.Cached:
		r.Seconds, r.OK = p.planSeconds, p.planOK
	default:
		r.Seconds, r.OK = m.predictLocked(p, planCost)
	}
	r.Volatile = m.volatileLocked(p)
	m.mu.RUnlock() // not deferred: nothing above panics, and this runs per statement
	return r
}

// PlanTTLOf is how long pattern fp's cached plan cost stays valid: [PlanTTL] less up to a
// quarter of it, by the fingerprint. The patterns a deploy explains in the same second expire
// spread over fifteen seconds rather than all in the same second of every minute, where they
// would all be explained again together; each pattern keeps its spread from one expiry to the
// next.
func PlanTTLOf(fp uint64) time.Duration {
	const spread = 1024
	return PlanTTL - time.Duration(fp%spread)*(PlanTTL/4)/spread
}

// PutPlan caches planCost, from an EXPLAIN of pattern fp at now, for [PlanTTLOf]: Predict uses it
// for the pattern's executions that are not explained themselves. Negative or non-finite costs
// are ignored.
func (m *Model) PutPlan(now time.Time, fp uint64, planCost float64) {
	if !(planCost >= 0) || math.IsInf(planCost, 0) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p, _ := m.patterns.put(fp)
	p.planCost, p.planExpires = planCost, now.Add(PlanTTLOf(fp))
	m.updateLocked(p)
}

// PutPlanFailed notes that an EXPLAIN of pattern fp failed at now: for [PlanTTLOf] Predict
// serves the pattern's executions from its history, as cached with no plan cost, so that a
// pattern whose EXPLAIN keeps failing (an argument whose encoding depends on a type the
// untyped EXPLAIN does not know) is not explained again at every execution.
func (m *Model) PutPlanFailed(now time.Time, fp uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, _ := m.patterns.put(fp)
	p.planCost, p.planExpires = 0, now.Add(PlanTTLOf(fp))
	m.updateLocked(p)
}

// ForgetPlanFailed forgets a failed EXPLAIN of pattern fp (PutPlanFailed), so that its next
// execution is explained again: the statement failed as well, so the failure was likely its
// own (a table not made yet), not the untyped EXPLAIN's.
func (m *Model) ForgetPlanFailed(fp uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, _ := m.patterns.get(fp); p != nil && p.planCost == 0 {
		p.planExpires = time.Time{}
		m.updateLocked(p)
	}
}

// PutQueryID records that the server identifies pattern fp's statements, of normalised text
// text, by queryID, as an EXPLAIN reported (see [Plan]); 0, an EXPLAIN that reported none, is
// only counted ([Model.Unidentified]).
func (m *Model) PutQueryID(fp uint64, text string, queryID int64) {
	if queryID == 0 {
		m.unidentified.Add(1)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p, _ := m.patterns.put(fp)
	p.queryID = queryID
	if p.text == "" {
		p.text = text // for introspection (Top), of a pattern whose executions train nothing (a batch's)
	}
}

// updateLocked works out p's cached predictions for its plan cost. The caller holds m.mu.
func (m *Model) updateLocked(p *pattern) {
	p.planSeconds, p.planOK = m.predictLocked(p, p.planCost)
	p.planServer = p.serverSeconds(p.planCost)
}

// serverSeconds is p's prediction on the server's clock for planCost: planCost × k, where k is
// the server's mean seconds over the mean planner cost of the pattern's executions; the
// server's mean itself without a plan cost of both.
func (p *pattern) serverSeconds(planCost float64) float64 {
	if validPlan(planCost) && p.nPlanned > 0 {
		return planCost * (p.serverMean / p.plan)
	}
	return p.serverMean
}

// predictLocked is Predict's seconds for pattern p (nil when the pattern is not in the table).
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
// with planner cost planCost (0 if none was known): own reports that planCost is the
// execution's own, from an EXPLAIN of it, not the pattern's cached plan cost of another's
// arguments. text is the pattern's normalised text, which Top reports (the model keeps the
// first it is given). runs is how many successful executions this one stands for (at least 1):
// a caller that trains on one in n of a pattern's executions passes n, so that Top counts the
// pattern's executions, not its samples. Samples with a negative or non-finite actual time are
// ignored.
func (m *Model) Observe(fp uint64, text string, planCost, actual float64, own bool, runs uint64) {
	if !(actual >= 0) || math.IsInf(actual, 0) { // also rejects NaN
		return
	}
	planned := validPlan(planCost)
	m.mu.Lock()
	defer m.mu.Unlock()
	p, _ := m.patterns.put(fp)
	if !p.refused.IsZero() {
		// The first execution since budgets refused the pattern as too costly (a probe): the
		// history that predicted too much is what is in doubt, so this sample starts it anew.
		// So does the cached plan cost unless the probe brings its own (planCost): it was the
		// refused statements', which may not be the next statement's either. The server's
		// report stands: it is the server's own account, which its next reports correct
		// from the executions it sees, this probe's among them.
		next := pattern{queryID: p.queryID, text: p.text, runs: p.runs,
			serverMean: p.serverMean, serverUntil: p.serverUntil}
		if planned {
			next.planCost, next.planExpires = p.planCost, p.planExpires
		}
		*p = next
	}
	if p.text == "" {
		p.text = text
	}
	wasVolatile := m.volatileLocked(p)
	p.n++
	p.runs += max(runs, 1)
	if p.n == 1 {
		// Seed the averages rather than decay from zero, which would under-predict a new pattern.
		p.mean, p.variance = actual, 0
	} else {
		d := actual - p.mean
		p.mean += alphaPattern * d
		p.variance = (1 - alphaPattern) * (p.variance + alphaPattern*d*d)
	}
	if !wasVolatile && p.cachedPairs && m.volatileLocked(p) {
		// Its cost varies widely, most likely with its arguments: the k that executions priced
		// by a cached plan cost, another execution's, taught (their mean time over that plan)
		// would price a call by its own plan (explain mode auto from now on) at hundreds of
		// times its cost. Its plan history starts anew, this sample's pair included.
		p.forgetPlans()
		planned = false
	}
	if planned {
		p.cachedPairs = p.cachedPairs || !own
		p.nPlanned++
		p.actualP = ema(p.actualP, actual, alphaPattern, p.nPlanned)
		p.plan = ema(p.plan, planCost, alphaPattern, p.nPlanned)
		p.observeBucket(planCost, actual)
		if planCost >= minGlobalPlan {
			m.gN++
			m.gActual = ema(m.gActual, actual, alphaGlobal, m.gN)
			m.gPlan = ema(m.gPlan, planCost, alphaGlobal, m.gN)
		}
	}
	m.updateLocked(p)
}

// NeverFits notes at now that a budget refused an execution of pattern fp because its
// prediction exceeds a limit that no wait lifts (per_query_limit, or a cost larger than the
// bucket), and reports whether this execution should instead run as a probe: once [Relearn]
// after the first such refusal since the pattern's last observed execution, and then once per
// Relearn while the refusals go on. Without probes a prediction that is too high would refuse
// the pattern for good, as nothing would run to correct it. The first execution observed after
// the refusal restarts the pattern's history from its own sample ([Model.Observe]).
func (m *Model) NeverFits(now time.Time, fp uint64) (probe bool) {
	// A storm of refusals mostly finds the pattern already noted and its next probe not due:
	// that is read under the read lock, so that it does not hold up every Predict.
	m.mu.RLock()
	p, _ := m.patterns.get(fp)
	news := p == nil || p.refusalNews(now)
	m.mu.RUnlock()
	if !news {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// A pattern the table does not hold yet (never run, its plan cost not cached: explain:
	// call) is entered here, so that its refusals are counted towards a probe.
	p, _ = m.patterns.put(fp)
	switch {
	case !p.refusalNews(now): // another refusal got here first
		return false
	case p.refused.IsZero():
		p.refused = now
		return false
	}
	p.probed = now
	return true
}

// refusalNews reports whether a refusal of p at now for a prediction that never fits changes
// p: it is the first since p's last observed execution, or a probe is due (NeverFits).
func (p *pattern) refusalNews(now time.Time) bool {
	return p.refused.IsZero() || now.Sub(p.refused) >= Relearn && now.Sub(p.probed) >= Relearn
}

// Unidentified returns how many EXPLAINs reported no query identifier ([Model.PutQueryID] of
// 0): the server computes none (compute_query_id off, or auto without pg_stat_statements
// loaded; before PostgreSQL 14), so it can report no pattern's cost.
func (m *Model) Unidentified() uint64 { return m.unidentified.Load() }

// QueryID pairs a pattern with the server's query identifier of its statements.
type QueryID struct {
	Fingerprint uint64
	ID          int64
}

// QueryIDs appends to dst the patterns whose query identifier is known, at most max of them,
// the most recently trained or explained first.
func (m *Model) QueryIDs(dst []QueryID, max int) []QueryID {
	m.mu.RLock()
	defer m.mu.RUnlock()
	m.patterns.each(func(fp uint64, p *pattern) {
		if p.queryID != 0 && len(dst) < max {
			dst = append(dst, QueryID{Fingerprint: fp, ID: p.queryID})
		}
	})
	return dst
}

// ObserveServer trains pattern fp on the server's clock at now: the server reported that the
// executions of query id (the pattern's, see QueryIDs) took seconds each on average, planning
// included where the server tracks it, over its recent reports (the reader averages them,
// weighted by executions: package serverclock), which seconds replaces. Predictions for the pattern
// are then on the server's clock until until (Prediction.Server); after, without a newer
// report, they return to the client's. It returns nil when the report was taken;
// [ErrImplausible] when the pattern's executions as the client measured them rule it out (the
// server spends part of the time its client waits: floor is the network's round trip that the
// client's measurements had taken off); [ErrNotObserved] when the pattern is gone, its query
// identifier changed, or seconds is negative or not finite.
func (m *Model) ObserveServer(now time.Time, fp uint64, id int64, seconds float64, until time.Time, floor float64) error {
	if !(seconds >= 0) || math.IsInf(seconds, 0) {
		return ErrNotObserved
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p, _ := m.patterns.get(fp)
	switch {
	case p == nil || p.queryID != id:
		return ErrNotObserved
	case p.n > 0 && seconds > implausibleServer*(p.mean+floor):
		return ErrImplausible
	}
	p.serverMean, p.serverUntil = seconds, until
	m.updateLocked(p)
	return nil
}

// implausibleServer is how many times the client's mean (with the network's round trip) a
// server's mean may be before it is taken for nonsense: the server's time is part of the
// client's, but both are averages, the client's a slow one of a sample of its executions, and
// a pattern whose cost rises is ahead on the server's clock for a while.
const implausibleServer = 4

var (
	// ErrImplausible is ObserveServer's answer to a server mean that the client's own
	// measurements of the pattern rule out (a pg_stat_statements that returns nonsense).
	ErrImplausible = errors.New("cost: a server mean beyond what the client waited for the pattern's executions")
	// ErrNotObserved is ObserveServer's answer to a report of a pattern it no longer holds (or
	// under another query identifier), or of a time that is negative or not finite.
	ErrNotObserved = errors.New("cost: server report not taken")
)

// ema returns the average avg updated with sample x; n counts samples including x. Until
// 1/alpha samples it is their plain mean, so that no early sample outweighs the others: seeded
// with its first sample and then moving by alpha, a slow average (the global k's, alpha 0.01)
// would keep most of that one sample for a hundred more (a lock wait would price every new
// pattern as if it waited too).
func ema(avg, x, alpha float64, n uint64) float64 {
	return avg + max(alpha, 1/float64(n))*(x-avg)
}

func validPlan(c float64) bool { return c > 0 && !math.IsInf(c, 0) }

// globalKLocked is the k of patterns with no plan history: what the executions taught, with
// [DefaultGlobalK] standing in for those not yet seen until globalPrior have been, so that
// the first few (a statement that waited on a lock) do not price every new pattern alone. The
// caller holds m.mu.
func (m *Model) globalKLocked() float64 {
	w := float64(min(m.gN, globalPrior)) / globalPrior
	if w == 0 {
		return DefaultGlobalK
	}
	return w*(m.gActual/m.gPlan) + (1-w)*DefaultGlobalK
}

// volatileLocked is Prediction.Volatile for pattern p (nil when the pattern is not in the table).
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
	m.explainN++
	m.explainMean = ema(m.explainMean, seconds, alphaExplain, m.explainN)
}

// PatternStats describes one pattern's learned state, for introspection.
type PatternStats struct {
	Fingerprint uint64
	Text        string // the normalised text Observe or PutQueryID was given; "" when none was
	// Count is the successful executions since the pattern entered the table: those observed,
	// each weighted by its Observe's runs. Samples is the executions observed (trained on)
	// since its history last started.
	Count, Samples uint64
	MeanActual     float64 // EMA of actual execution seconds
	MeanPlanCost   float64 // EMA of planner cost; 0 when the pattern was never observed with one
	K              float64 // seconds per planner cost unit in use: the pattern's, or the global one
	// ServerMean is the server's mean execution seconds of the pattern in its reports (see
	// [Model.ObserveServer]); 0 when it has none. Server reports that predictions use it now.
	ServerMean float64
	Server     bool
	// Predicted is the cost its cached plan predicts for a pattern priced by a plan but never
	// observed (a batch's: its statements are not timed apart); 0 otherwise.
	Predicted float64
}

// Top returns, at now, the n patterns with the most executions (Count), most first (ties by
// fingerprint), or nil when n <= 0. It copies the table under the lock and sorts outside it: it
// serves introspection, not statements.
func (m *Model) Top(now time.Time, n int) []PatternStats {
	if n <= 0 {
		return nil
	}
	m.mu.RLock()
	all := make([]PatternStats, 0, m.patterns.len())
	gk := m.globalKLocked()
	m.patterns.each(func(fp uint64, p *pattern) {
		s := PatternStats{Fingerprint: fp, Text: p.text, Count: p.runs, Samples: p.n, MeanActual: p.mean, K: gk, ServerMean: p.serverMean,
			Server: now.Before(p.serverUntil)}
		switch {
		case p.nPlanned > 0:
			s.MeanPlanCost, s.K = p.plan, p.actualP/p.plan
			if s.Server {
				s.K = p.serverMean / p.plan
			}
		case p.n == 0 && p.serverMean == 0 && !p.planOK:
			return // neither observed, nor reported by the server, nor priced by a plan
		case p.n == 0 && p.planOK:
			// Priced by its plan but never timed (a batch's statements train nothing, and one
			// refused never ran): its cost is its prediction.
			s.MeanPlanCost, s.Predicted = p.planCost, p.planSeconds
		}
		all = append(all, s)
	})
	m.mu.RUnlock()
	slices.SortFunc(all, func(a, b PatternStats) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Fingerprint, b.Fingerprint))
	})
	return slices.Clone(all[:min(n, len(all))])
}

// ErrNotSent is wrapped by every error of an EXPLAIN that reached no server (an aborted
// transaction, a busy or closed connection, arguments that cannot be encoded): the engine then
// counts no EXPLAIN call. Any other error means an EXPLAIN was sent and failed.
var ErrNotSent = errors.New("cost: explain not sent")

// ErrUnencodable wraps ErrNotSent for an EXPLAIN whose statement's arguments cannot be encoded
// untyped (a [16]byte uuid, a composite type registered on the connection), though the
// statement itself sends them: a failure of the pattern's EXPLAIN, which the engine counts and
// does not try again at every execution.
var ErrUnencodable = fmt.Errorf("%w: cannot encode the arguments", ErrNotSent)

// ErrConnLost is wrapped by the error of an EXPLAIN whose connection closed while it was on its
// way (the server ended the session, the network failed): it was sent, and its statement
// cannot run on that connection either.
var ErrConnLost = errors.New("cost: the connection closed during the explain")

// ConnLost is err, an EXPLAIN's failure that closed its connection, marked with ErrConnLost:
// it reads as err (the server's FATAL, say), which the statement is answered with.
func ConnLost(err error) error { return connLost{err} }

type connLost struct{ err error }

func (e connLost) Error() string   { return e.err.Error() }
func (e connLost) Unwrap() []error { return []error{ErrConnLost, e.err} }

// ErrCancelled is wrapped, beside the server's error, by the error of an EXPLAIN that the
// server cancelled: the session's lock_timeout or statement_timeout cut it off (or an
// administrator cancelled the session's work). The statement it preceded would wait for the
// same lock, or plan as long, under the same limits: the engine answers the statement with
// this error rather than send it to meet them a second time.
var ErrCancelled = errors.New("pgtraffic: the server cancelled the statement's EXPLAIN")
