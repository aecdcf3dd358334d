package cost

import (
	"math"
	"testing"
	"time"
)

// cachedPlan is the plan cost Predict uses for fp at now when the execution is not explained.
func cachedPlan(m *Model, now time.Time, fp uint64) (float64, bool) {
	p := m.Predict(now, fp, 0)
	return p.PlanCost, p.Cached
}

func TestPlanTTL(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	m := NewModel(10)
	m.PutPlan(t0, 1, 123.5)
	tests := []struct {
		name   string
		now    time.Time
		fp     uint64
		want   float64
		wantOK bool
	}{
		{"just put", t0, 1, 123.5, true},
		{"within the TTL", t0.Add(PlanTTLOf(1) - time.Second), 1, 123.5, true},
		{"at the TTL", t0.Add(PlanTTLOf(1)), 1, 0, false},
		{"after the TTL", t0.Add(time.Hour), 1, 0, false},
		{"clock before the put counts as fresh", t0.Add(-time.Second), 1, 123.5, true},
		{"unknown fingerprint", t0, 2, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, ok := cachedPlan(m, tt.now, tt.fp); got != tt.want || ok != tt.wantOK {
				t.Fatalf("cached plan = %v, %v; want %v, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
	t.Run("a new put restarts the TTL", func(t *testing.T) {
		m.PutPlan(t0.Add(time.Hour), 1, 99)
		if got, ok := cachedPlan(m, t0.Add(time.Hour+30*time.Second), 1); !ok || got != 99 {
			t.Fatalf("cached plan = %v, %v; want 99, true", got, ok)
		}
	})
	t.Run("the execution's own plan cost wins", func(t *testing.T) {
		if p := m.Predict(t0.Add(time.Hour), 1, 7); p.Cached || p.PlanCost != 7 {
			t.Fatalf("Predict with a plan cost = %+v; want PlanCost 7, not cached", p)
		}
	})
}

// TestPlanTTLMatchesSub pins the expiry to the rule: a plan cost put at "at" is fresh at now if
// now.Sub(at) < PlanTTLOf(fp). Times come with a monotonic clock reading (from time.Now, as in the
// engine) and without one (injected clocks, Round(0)), in every mix, around the TTL boundary,
// before the put, and centuries away where Sub saturates.
func TestPlanTTLMatchesSub(t *testing.T) {
	mono := time.Now()
	bases := []time.Time{
		mono,
		mono.Round(0), // the same instant without the monotonic reading
		time.Date(2026, 3, 1, 12, 0, 0, 999_999_999, time.UTC),
		time.Unix(0, 0),
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	ttl := PlanTTLOf(1)
	offsets := []time.Duration{0, 1, -1, ttl - 1, ttl, ttl + 1, PlanTTL, -PlanTTL, 2 * PlanTTL,
		time.Minute, -time.Minute, 200 * 365 * 24 * time.Hour, -200 * 365 * 24 * time.Hour}
	m := NewModel(1)
	for _, at := range bases {
		for _, strip := range []bool{false, true} {
			m.PutPlan(at, 1, 42)
			for _, d := range offsets {
				now := at.Add(d)
				if strip {
					now = now.Round(0)
				}
				want := now.Sub(at) < ttl
				if _, got := cachedPlan(m, now, 1); got != want {
					t.Fatalf("put at %v, predicted at %v (monotonic stripped %v): fresh %v, want %v",
						at, now, strip, got, want)
				}
			}
		}
	}
}

// TestPlanTTLsSpread: the plans a deploy explains in one second (hundreds of new patterns)
// expire spread over a quarter of PlanTTL, not all in the same second of every minute, where
// each would be explained again together; none outlives PlanTTL.
func TestPlanTTLsSpread(t *testing.T) {
	lo, hi := PlanTTL, time.Duration(0)
	for fp := range uint64(240) {
		ttl := PlanTTLOf(fp * 0x9e3779b97f4a7c15) // fingerprints are hashes
		lo, hi = min(lo, ttl), max(hi, ttl)
	}
	if hi > PlanTTL || lo < PlanTTL*3/4 || hi-lo < PlanTTL/5 {
		t.Errorf("240 patterns' plans expire between %v and %v after their EXPLAIN; want spread over most of [%v, %v]",
			lo, hi, PlanTTL*3/4, PlanTTL)
	}
}

func TestPutPlanRejectsInvalidCost(t *testing.T) {
	now := time.Unix(1000, 0)
	m := NewModel(10)
	for i, cost := range []float64{-1, math.NaN(), math.Inf(1)} {
		m.PutPlan(now, uint64(i), cost)
	}
	if patternCount(m) != 0 {
		t.Fatalf("patterns = %d after invalid puts, want 0", patternCount(m))
	}
	m.PutPlan(now, 7, 0) // a zero-cost plan (e.g. WHERE false) is a valid cost
	if p := m.Predict(now, 7, 0); !p.Cached || p.PlanCost != 0 {
		t.Fatalf("Predict = %+v; want the cached zero cost", p)
	}
}

func TestPutPlanBound(t *testing.T) {
	const bound = 10_000
	start := time.Unix(1_000_000, 0)
	m := NewModel(bound)
	for fp := uint64(0); fp < 100_000; fp++ {
		m.PutPlan(start.Add(time.Duration(fp)*time.Microsecond), fp, float64(fp+1))
	}
	if patternCount(m) != bound {
		t.Fatalf("patterns = %d, want %d", patternCount(m), bound)
	}
	now := start.Add(time.Second)
	for _, tt := range []struct {
		fp     uint64
		wantOK bool
	}{{0, false}, {100_000 - bound - 1, false}, {100_000 - bound, true}, {99_999, true}} {
		if got, ok := cachedPlan(m, now, tt.fp); ok != tt.wantOK || (ok && got != float64(tt.fp+1)) {
			t.Fatalf("cached plan of %d = %v, %v; want ok %v", tt.fp, got, ok, tt.wantOK)
		}
	}
}

func TestPutPlanEvictsLeastRecent(t *testing.T) {
	now := time.Unix(0, 0)
	m := NewModel(2)
	m.PutPlan(now, 1, 1)
	m.Observe(2, "", 0, 0.001, false, 1)
	m.PutPlan(now, 1, 10) // re-explained: now the most recent
	m.PutPlan(now, 3, 3)  // evicts 2, trained longest ago
	for _, tt := range []struct {
		fp   uint64
		want bool
	}{{1, true}, {2, false}, {3, true}} {
		if _, ok := m.patterns.get(tt.fp); ok != tt.want {
			t.Fatalf("pattern %d held = %v, want %v", tt.fp, ok, tt.want)
		}
	}
	// Explained but never observed (a batch's statements train nothing), they are listed with
	// the cost their plan predicts.
	top := m.Top(time.Time{}, 5)
	if len(top) != 2 || top[0].Fingerprint != 1 || top[1].Fingerprint != 3 {
		t.Fatalf("Top of explained patterns never observed: %+v, want patterns 1 and 3", top)
	}
	plans := map[uint64]float64{1: 10, 3: 3}
	for _, s := range top {
		if s.Count != 0 || s.MeanPlanCost != plans[s.Fingerprint] || math.Abs(s.Predicted-s.K*s.MeanPlanCost) > 1e-12 {
			t.Errorf("explained pattern %d: %+v, want plan cost %v and the prediction k × plan cost", s.Fingerprint, s, plans[s.Fingerprint])
		}
	}
}

func TestPredictAllocs(t *testing.T) {
	now := time.Unix(0, 0)
	m := NewModel(testPatterns)
	m.Observe(1, "", 10, 0.001, false, 1)
	m.PutPlan(now, 1, 10)
	if n := testing.AllocsPerRun(100, func() { m.Predict(now, 1, 0) }); n != 0 {
		t.Fatalf("Predict allocates %v times, want 0", n)
	}
}

// BenchmarkDecisionCacheHit is the cost work on the decision path when the plan cost is cached:
// the cached plan cost, the volatility check of explain mode auto, and a prediction, in one call.
func BenchmarkDecisionCacheHit(b *testing.B) {
	now := time.Now()
	m := NewModel(testPatterns)
	for fp := range uint64(testPatterns) {
		m.Observe(fp, "", 1000, 0.003, false, 1)
		m.PutPlan(now, fp, float64(fp))
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var i uint64
		for pb.Next() {
			m.Predict(now, i%testPatterns, 0)
			i++
		}
	})
}

// TestCachedPlanFollowsTraining checks that a prediction from the cached plan cost is the one an
// explicit plan cost gets, however the pattern's history changes after the plan was cached.
func TestCachedPlanFollowsTraining(t *testing.T) {
	m := NewModel(testPatterns)
	now := time.Unix(1000, 0)
	const fp, plan = 7, 100.0
	m.PutPlan(now, fp, plan)
	steps := []struct {
		name   string
		actual float64 // observed before predicting; 0 for none
	}{
		{"before history: the global k", 0},
		{"first execution", 1},
		{"slower executions", 3},
		{"slower still", 5},
		{"faster again", 0.5},
	}
	for _, s := range steps {
		if s.actual > 0 {
			m.Observe(fp, "", plan, s.actual, false, 1)
		}
		cached := m.Predict(now, fp, 0)
		explicit := m.Predict(now, fp, plan)
		if !cached.Cached || cached.PlanCost != plan {
			t.Fatalf("%s: Predict(0) = %+v, want the cached plan cost %v", s.name, cached, plan)
		}
		if cached.Seconds != explicit.Seconds || cached.OK != explicit.OK {
			t.Errorf("%s: cached plan predicts %v (ok %v), the same plan cost explicitly %v (ok %v)",
				s.name, cached.Seconds, cached.OK, explicit.Seconds, explicit.OK)
		}
	}
	// A plan cost of 0 (EXPLAIN said nothing useful) predicts from history, like no plan.
	m.PutPlan(now, fp, 0)
	m.Observe(fp, "", 0, 2, false, 1)
	got := m.Predict(now, fp, 0)
	if want, _ := meanActual(m, fp); got.Seconds != want {
		t.Errorf("cached plan cost 0: predicts %v, want the mean actual %v", got.Seconds, want)
	}
}

// TestPlanFailedTTL: a failed EXPLAIN is remembered for PlanTTL as a plan with no cost: the
// pattern's executions are predicted from its history, and explained again only after the TTL.
func TestPlanFailedTTL(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	m := NewModel(10)
	m.PutPlan(t0.Add(-2*PlanTTL), 1, 123.5) // an old plan, expired
	m.PutPlanFailed(t0, 1)
	if got, ok := cachedPlan(m, t0.Add(PlanTTL-time.Second), 1); got != 0 || !ok {
		t.Fatalf("within the TTL of a failure: cached plan = %v, %v; want 0, true (no plan cost, not explained)", got, ok)
	}
	if p := m.Predict(t0, 1, 0); p.Seconds != m.Predict(t0, 2, 0).Seconds {
		t.Fatalf("a pattern whose EXPLAIN failed, with no history, predicted %v; a new pattern %v", p.Seconds, m.Predict(t0, 2, 0).Seconds)
	}
	if _, ok := cachedPlan(m, t0.Add(PlanTTL), 1); ok {
		t.Fatal("at the TTL of a failure: still cached; want the pattern explained again")
	}
}

// TestForgetPlanFailed: a failed EXPLAIN forgotten (its statement failed too) is explained
// again at the next execution; a plan that did not fail is kept.
func TestForgetPlanFailed(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	m := NewModel(10)
	m.PutPlanFailed(t0, 1)
	m.PutPlan(t0, 2, 50)
	m.ForgetPlanFailed(1)
	m.ForgetPlanFailed(2)
	m.ForgetPlanFailed(3) // unknown: nothing to forget
	if _, ok := cachedPlan(m, t0.Add(time.Second), 1); ok {
		t.Error("a forgotten failure is still cached; want the pattern explained again")
	}
	if got, ok := cachedPlan(m, t0.Add(time.Second), 2); got != 50 || !ok {
		t.Errorf("a plan that did not fail: cached %v, %v; want 50, true", got, ok)
	}
}
