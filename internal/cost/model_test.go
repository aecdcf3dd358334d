package cost

import (
	"math"
	"sync"
	"testing"
	"time"
)

// testPatterns sizes the model of the tests that need a large table, as the engine sizes it by
// default (the driver's pattern cache size).
const testPatterns = 10_000

// predict is Model.Predict's seconds and OK.
func predict(m *Model, fp uint64, planCost float64) (float64, bool) {
	p := m.Predict(time.Time{}, fp, planCost)
	return p.Seconds, p.OK
}

// unseen is a fingerprint no test trains or explains.
const unseen = math.MaxUint64

// globalK is the k Predict applies to a pattern with no plan history: its prediction for one
// planner cost unit.
func globalK(m *Model) float64 {
	s, _ := predict(m, unseen, 1)
	return s
}

// patternK is the k Top reports for pattern fp (the global k for a pattern never observed with a
// plan cost), or 0 when fp has no observed execution.
func patternK(m *Model, fp uint64) float64 {
	for _, s := range m.Top(time.Time{}, patternCount(m)) {
		if s.Fingerprint == fp {
			return s.K
		}
	}
	return 0
}

// meanActual is Predict's answer without a plan cost: the pattern's mean actual seconds, ok false
// for a pattern with no history.
func meanActual(m *Model, fp uint64) (float64, bool) {
	return predict(m, fp, 0)
}

// patternCount is the number of patterns in m's table, explained or observed.
func patternCount(m *Model) int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.patterns.len()
}

// explainMean is the mean EXPLAIN round trip in seconds, ok false before any was recorded.
func explainMean(m *Model) (float64, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.explainMean, m.explainN > 0
}

func near(got, want, relTol float64) bool {
	if want == 0 {
		return math.Abs(got) <= relTol
	}
	return math.Abs(got-want) <= relTol*math.Abs(want)
}

func TestModelPredictBeforeHistory(t *testing.T) {
	m := NewModel(testPatterns)
	tests := []struct {
		name     string
		planCost float64
		want     float64
		wantOK   bool
	}{
		{"plan cost uses the default global k", 1000, 1000 * DefaultGlobalK, true},
		{"no plan and no history", 0, 0, false},
		{"negative plan cost means no plan", -5, 0, false},
		{"NaN plan cost means no plan", math.NaN(), 0, false},
		{"infinite plan cost means no plan", math.Inf(1), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := predict(m, 42, tt.planCost)
			if ok != tt.wantOK || !near(got, tt.want, 1e-12) {
				t.Fatalf("Predict(42, %v) = %v, %v; want %v, %v", tt.planCost, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestModelKConverges(t *testing.T) {
	tests := []struct {
		name   string
		k      float64
		noise  []float64 // multiplicative noise cycled over the samples
		tol    float64
		planFn func(i int) float64
	}{
		{"constant plan, exact", 2e-6, []float64{1}, 1e-9, func(int) float64 { return 5000 }},
		{"plan varies with arguments", 1e-5, []float64{1}, 1e-9, func(i int) float64 { return float64(100 + i%7*300) }},
		{"noisy timings", 4e-6, []float64{0.9, 1.1, 1.05, 0.95}, 0.1, func(int) float64 { return 2000 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := NewModel(10)
			for i := range 200 {
				plan := tt.planFn(i)
				m.Observe(7, "", plan, plan*tt.k*tt.noise[i%len(tt.noise)], false, 1)
			}
			if got := patternK(m, 7); !near(got, tt.k, tt.tol) {
				t.Fatalf("K = %v, want %v ± %v", got, tt.k, tt.tol)
			}
			got, ok := predict(m, 7, 10_000)
			if !ok || !near(got, 10_000*tt.k, tt.tol) {
				t.Fatalf("Predict(7, 10000) = %v, %v; want %v", got, ok, 10_000*tt.k)
			}
		})
	}
}

func TestModelKFollowsChange(t *testing.T) {
	m := NewModel(10)
	for range 50 {
		m.Observe(1, "", 1000, 1000*1e-6, false, 1)
	}
	// The table grew: the same plan cost now takes 10× as long. With α = 0.2 the EMAs hold less
	// than 5% of the old regime after 14 executions.
	for range 14 {
		m.Observe(1, "", 1000, 1000*1e-5, false, 1)
	}
	if got := patternK(m, 1); !near(got, 1e-5, 0.05) {
		t.Fatalf("K after regime change = %v, want ≈ 1e-5", got)
	}
}

func TestModelFirstSampleSeeds(t *testing.T) {
	m := NewModel(10)
	m.Observe(3, "", 500, 0.25, false, 1)
	if got, ok := meanActual(m, 3); !ok || got != 0.25 {
		t.Fatalf("MeanActual after one sample = %v, %v; want 0.25, true", got, ok)
	}
	if got := patternK(m, 3); got != 0.25/500 {
		t.Fatalf("K after one sample = %v, want %v", got, 0.25/500.0)
	}
}

func TestModelGlobalKForNewPatterns(t *testing.T) {
	m := NewModel(100)
	// Trivial plans only (cost 0.01, a round trip each, and a cost-10 lookup): their time is
	// their fixed cost, which says nothing of a planner unit's, so the default stands.
	for range 500 {
		m.Observe(3, "", 0.01, 150e-6, false, 1)
		m.Observe(2, "", 10, 10*1e-4, false, 1)
	}
	if gk := globalK(m); gk != DefaultGlobalK {
		t.Fatalf("GlobalK after trivial plans only = %v, want the default %v", gk, DefaultGlobalK)
	}
	// A large pattern (k = 2e-6) teaches it; the small ones still do not.
	for range 500 {
		m.Observe(1, "", 100_000, 100_000*2e-6, false, 1)
		m.Observe(2, "", 10, 10*1e-4, false, 1)
	}
	gk := globalK(m)
	want := 2e-6
	if !near(gk, want, 1e-9) {
		t.Fatalf("GlobalK = %v, want ≈ %v", gk, want)
	}
	if gk == DefaultGlobalK {
		t.Fatal("GlobalK still the default after history")
	}
	got, ok := predict(m, 99, 50_000)
	if !ok || !near(got, 50_000*gk, 1e-12) {
		t.Fatalf("Predict(new pattern) = %v, %v; want %v", got, ok, 50_000*gk)
	}
	if patternK(m, 2) == gk {
		t.Fatal("K(known pattern) should be its own, not the global one")
	}
}

func TestModelHistoryOnly(t *testing.T) {
	m := NewModel(10)
	// No plan cost was known for any execution (EXPLAIN skipped or failed).
	for _, a := range []float64{0.1, 0.1, 0.1} {
		m.Observe(5, "", 0, a, false, 1)
	}
	tests := []struct {
		name     string
		planCost float64
		want     float64
	}{
		{"no plan: mean actual", 0, 0.1},
		{"plan known now: plan × global k", 2000, 2000 * DefaultGlobalK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := predict(m, 5, tt.planCost)
			if !ok || !near(got, tt.want, 1e-9) {
				t.Fatalf("Predict = %v, %v; want %v", got, ok, tt.want)
			}
		})
	}
	if globalK(m) != DefaultGlobalK {
		t.Fatal("executions without a plan cost trained the global k")
	}
}

func TestModelObserveIgnoresInvalid(t *testing.T) {
	m := NewModel(10)
	for _, a := range []float64{math.NaN(), math.Inf(1), -1} {
		m.Observe(8, "", 100, a, false, 1)
	}
	if patternCount(m) != 0 {
		t.Fatalf("invalid samples created %d patterns", patternCount(m))
	}
	m.Observe(8, "", math.NaN(), 0.5, false, 1) // an invalid plan cost is "no plan", the actual still counts
	if got, ok := meanActual(m, 8); !ok || got != 0.5 {
		t.Fatalf("MeanActual = %v, %v; want 0.5, true", got, ok)
	}
	if patternK(m, 8) != DefaultGlobalK {
		t.Fatal("a NaN plan cost trained k")
	}
}

func TestModelVolatile(t *testing.T) {
	steady := []float64{0.1, 0.1, 0.1, 0.1, 0.1, 0.1}
	wild := []float64{0.01, 0.5, 0.01, 0.5, 0.01, 0.5, 0.01, 0.5}
	tests := []struct {
		name    string
		explain float64 // mean EXPLAIN round trip; 0 = never observed
		samples []float64
		want    bool
	}{
		{"steady cost", 0.001, steady, false},
		{"wide variation, mean dwarfs explain", 0.001, wild, true},
		{"wide variation, explain too slow", 0.05, wild, false},
		{"wide variation, no explain measured yet", 0, wild, false},
		{"too few samples", 0.001, wild[:4], false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := NewModel(10)
			if tt.explain > 0 {
				m.ObserveExplain(tt.explain)
			}
			for _, s := range tt.samples {
				m.Observe(1, "", 0, s, false, 1)
			}
			if got := m.Predict(time.Time{}, 1, 0).Volatile; got != tt.want {
				t.Fatalf("Volatile = %v, want %v", got, tt.want)
			}
		})
	}
	t.Run("flips back when the cost settles", func(t *testing.T) {
		m := NewModel(10)
		m.ObserveExplain(0.001)
		for _, s := range wild {
			m.Observe(1, "", 0, s, false, 1)
		}
		if !m.Predict(time.Time{}, 1, 0).Volatile {
			t.Fatal("not volatile after wide variation")
		}
		for range 20 {
			m.Observe(1, "", 0, 0.3, false, 1)
		}
		if m.Predict(time.Time{}, 1, 0).Volatile {
			t.Fatal("still volatile after 20 steady executions")
		}
	})
	if NewModel(1).Predict(time.Time{}, 9, 0).Volatile {
		t.Fatal("unknown pattern reported volatile")
	}
}

func TestModelObserveExplain(t *testing.T) {
	m := NewModel(1)
	if _, ok := explainMean(m); ok {
		t.Fatal("ExplainMean ok before any observation")
	}
	m.ObserveExplain(math.NaN())
	m.ObserveExplain(-1)
	if _, ok := explainMean(m); ok {
		t.Fatal("invalid round trips were recorded")
	}
	m.ObserveExplain(0.002)
	m.ObserveExplain(0.004)
	if got, _ := explainMean(m); !near(got, 0.003, 1e-12) { // the plain mean of the first 1/alpha
		t.Fatalf("ExplainMean = %v, want 0.003", got)
	}
}

func TestModelTableBound(t *testing.T) {
	const bound = 10_000
	m := NewModel(bound)
	m.Observe(0, "", 0, 1, false, 1) // trained once, long ago: evicted by the flood
	for fp := uint64(1); fp <= 1_000_000; fp++ {
		m.Observe(fp, "", 0, 1, false, 1)
		if fp%100 == 0 {
			m.Observe(42, "", 0, 1, false, 1) // a hot pattern stays recent
		}
	}
	if got := patternCount(m); got != bound {
		t.Fatalf("patterns = %d, want %d", got, bound)
	}
	if _, ok := meanActual(m, 0); ok {
		t.Fatal("the least recently trained pattern was not evicted")
	}
	if _, ok := meanActual(m, 42); !ok {
		t.Fatal("a hot pattern was evicted")
	}
	if _, ok := meanActual(m, 1_000_000); !ok {
		t.Fatal("the newest pattern is missing")
	}
	if _, ok := meanActual(m, 1_000_000-bound); ok {
		t.Fatal("a pattern older than the bound survived")
	}
}

func TestModelTop(t *testing.T) {
	m := NewModel(100)
	counts := map[uint64]int{10: 5, 20: 9, 30: 1, 40: 9, 50: 3}
	for fp, n := range counts {
		for range n {
			m.Observe(fp, "", 100, 0.001, false, 1)
		}
	}
	m.Observe(60, "", 0, 0.5, false, 1) // never planned: global k, no plan cost
	tests := []struct {
		n    int
		want []uint64
	}{
		{0, nil},
		{1, []uint64{20}},
		{3, []uint64{20, 40, 10}},
		{100, []uint64{20, 40, 10, 50, 30, 60}},
	}
	for _, tt := range tests {
		t.Run("", func(t *testing.T) {
			top := m.Top(time.Time{}, tt.n)
			if len(top) != len(tt.want) {
				t.Fatalf("Top(%d) returned %d patterns, want %d", tt.n, len(top), len(tt.want))
			}
			for i, s := range top {
				if s.Fingerprint != tt.want[i] {
					t.Fatalf("Top(%d)[%d] = %d, want %d (all: %+v)", tt.n, i, s.Fingerprint, tt.want[i], top)
				}
				if want := uint64(counts[s.Fingerprint]); s.Fingerprint != 60 && s.Count != want {
					t.Fatalf("Count(%d) = %d, want %d", s.Fingerprint, s.Count, want)
				}
			}
		})
	}
	top := m.Top(time.Time{}, 100)
	if s := top[0]; !near(s.K, 1e-5, 1e-9) || !near(s.MeanActual, 0.001, 1e-9) || s.MeanPlanCost != 100 {
		t.Fatalf("Top stats = %+v, want K 1e-5, mean 0.001, plan 100", s)
	}
	if s := top[5]; s.K != globalK(m) || s.MeanPlanCost != 0 || s.MeanActual != 0.5 {
		t.Fatalf("unplanned pattern stats = %+v", s)
	}
}

func TestModelConcurrent(t *testing.T) {
	m := NewModel(64)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				fp := uint64((g*2000 + i) % 100)
				m.Observe(fp, "", 1000, 1000*3e-6, false, 1)
				m.ObserveExplain(0.001)
				predict(m, fp, 500)
				_ = m.Predict(time.Time{}, fp, 0).Volatile
				if i%500 == 0 {
					m.Top(time.Time{}, 5)
				}
			}
		}()
	}
	wg.Wait()
	if patternCount(m) != 64 {
		t.Fatalf("patterns = %d, want the bound 64", patternCount(m))
	}
	if got := globalK(m); !near(got, 3e-6, 1e-9) {
		t.Fatalf("GlobalK = %v, want 3e-6", got)
	}
}

func BenchmarkModelPredict(b *testing.B) {
	m := NewModel(testPatterns)
	for fp := range uint64(testPatterns) {
		m.Observe(fp, "", 1000, 0.003, false, 1)
	}
	b.ReportAllocs()
	b.ResetTimer()
	var sink float64
	for i := 0; b.Loop(); i++ {
		s, _ := predict(m, uint64(i)%testPatterns, 1234)
		sink += s
	}
	_ = sink
}

func BenchmarkModelPredictParallel(b *testing.B) {
	m := NewModel(testPatterns)
	for fp := range uint64(testPatterns) {
		m.Observe(fp, "", 1000, 0.003, false, 1)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var i uint64
		for pb.Next() {
			predict(m, i%testPatterns, 1234)
			i++
		}
	})
}

func BenchmarkModelObserve(b *testing.B) {
	m := NewModel(testPatterns)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		m.Observe(uint64(i)%testPatterns, "", 1000, 0.003, false, 1)
	}
}

// TestNeverFitsProbes: a pattern refused as too costly gets a probe Relearn after the first
// refusal, then one per Relearn; an unknown pattern none; the first execution observed after
// the refusals restarts its history from that sample, and ends the refusals.
func TestNeverFitsProbes(t *testing.T) {
	m := NewModel(10)
	t0 := time.Unix(1000, 0)
	if m.NeverFits(t0, 9) {
		t.Fatal("a probe for a pattern the model does not know")
	}
	for range 5 {
		m.Observe(1, "", 0, 2, false, 1) // learned: 2 s
	}
	for _, c := range []struct {
		at   time.Duration
		want bool
	}{{0, false}, {Relearn - 1, false}, {Relearn, true}, {Relearn + 1, false}, {2*Relearn - 1, false}, {2 * Relearn, true}} {
		if got := m.NeverFits(t0.Add(c.at), 1); got != c.want {
			t.Fatalf("NeverFits at +%v = %v, want %v", c.at, got, c.want)
		}
	}
	m.Observe(1, "", 0, 0.01, false, 1) // the probe
	if p := m.Predict(t0, 1, 0); p.Seconds != 0.01 || p.Samples != 1 {
		t.Fatalf("after the probe: %+v, want 10ms from its one sample", p)
	}
	if m.NeverFits(t0.Add(3*Relearn), 1) {
		t.Fatal("a probe at the first refusal after an execution")
	}
}

// TestGlobalKForgetsAnEarlyOutlier: the first large statement of a process that waited on a
// lock (2.5 s for a plan of 3,885) must not price every new pattern for the next hundred: the
// global k is the plain mean of its first samples, so ten ordinary executions bring it within
// a few times of theirs.
func TestGlobalKForgetsAnEarlyOutlier(t *testing.T) {
	m := NewModel(100)
	now := time.Time{}
	m.Observe(1, "", 3885, 2.5, false, 1) // a lock wait
	for i := range 10 {
		m.Observe(uint64(2+i), "", 3500, 3500*DefaultGlobalK, false, 1)
	}
	p := m.Predict(now, 999, 3385) // a new pattern
	if p.Seconds > 0.5 {
		t.Fatalf("a new pattern of plan 3385 after one lock wait and ten ordinary executions is predicted %.3gs; "+
			"want well under the 2.2s the lock wait alone would price it at", p.Seconds)
	}
}

// TestModelVolatileStartsPlanHistoryAnew: executions priced by one cached plan cost (10 units)
// whose times swing between 10 µs and 100 ms would teach a k of their mean over those 10 units.
// Once the pattern is volatile (explained per call under auto), a call of its own plan cost,
// 100,000 units for 100 ms, must not be priced by that k (400 s): its plan history starts
// anew, and the global k prices it until its own executions teach one. A pattern whose every
// execution was priced by its own plan (explain mode call) keeps its history.
func TestModelVolatileStartsPlanHistoryAnew(t *testing.T) {
	volatile := func(t *testing.T, own bool) *Model {
		m := NewModel(10)
		m.ObserveExplain(0.0005)
		for i := 0; !m.Predict(time.Time{}, 1, 0).Volatile; i++ {
			if i == 20 {
				t.Fatal("not volatile after 20 executions between 10 µs and 100 ms")
			}
			plan, actual := 10.0, 10e-6
			if i%2 == 1 {
				actual = 0.1
				if own {
					plan = 100_000
				}
			}
			m.Observe(1, "", plan, actual, own, 1)
		}
		return m
	}
	t.Run("priced by a cached plan", func(t *testing.T) {
		m := volatile(t, false)
		if s, _ := predict(m, 1, 100_000); !near(s, 100_000*DefaultGlobalK, 1e-9) {
			t.Errorf("a call of its own plan (100,000 units) predicted %.3gs, want the global k's %.3gs", s, 100_000*DefaultGlobalK)
		}
		m.Observe(1, "", 100_000, 0.1, true, 1)
		if s, _ := predict(m, 1, 100_000); !near(s, 0.1, 1e-9) {
			t.Errorf("after one execution of its own plan, predicted %.3gs, want 0.1s", s)
		}
	})
	t.Run("priced by its own plans", func(t *testing.T) {
		m := volatile(t, true)
		if s, _ := predict(m, 1, 100_000); !near(s, 0.1, 1e-9) {
			t.Errorf("a call of 100,000 units, as each of its like took 100 ms, predicted %.3gs, want 0.1s", s)
		}
		if s, _ := predict(m, 1, 10); !near(s, 10e-6, 1e-9) {
			t.Errorf("a call of 10 units, as each of its like took 10 µs, predicted %.3gs, want 10 µs", s)
		}
	})
}
