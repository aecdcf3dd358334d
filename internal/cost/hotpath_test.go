package cost

import (
	"math/rand/v2"
	"testing"
	"time"
)

// hotPathPatterns is how many patterns the hot-path benchmarks cycle through: the default table
// bound, so that lookups miss the CPU caches as they would in a busy process.
const hotPathPatterns = DefaultMaxPatterns

// trainedHotPath returns a model and a plan cache as the engine holds them after warming up: every
// pattern executed often enough to fill two cost buckets with distinct samples (so a median is
// not trivially sorted), an EXPLAIN round trip recorded (so Volatile runs its full check), and
// every plan cost cached at now. No pattern is volatile: plan costs and noise on k keep the
// coefficient of variation of actual times near 0.2, well below the threshold of 0.5.
func trainedHotPath() (*Model, *PlanCache, time.Time) {
	rng := rand.New(rand.NewPCG(1, 2))
	now := time.Now()
	m := NewModel(0)
	c := NewPlanCache(0, 0)
	m.ObserveExplain(0.0005)
	for fp := range uint64(hotPathPatterns) {
		for range 20 {
			plan := 1500 + 1500*rng.Float64()                      // two power-of-two ranges
			m.Observe(fp, plan, plan*3e-6*(0.8+0.4*rng.Float64())) // noisy k
		}
		c.Put(now, fp, 1500+float64(fp%1500))
	}
	return m, c, now
}

// noise returns n factors in [0.8, 1.2) for actual times, drawn before a benchmark's loop: small
// enough that no pattern turns volatile.
func noise(n int) []float64 {
	rng := rand.New(rand.NewPCG(3, 4))
	f := make([]float64, n)
	for i := range f {
		f[i] = 0.8 + 0.4*rng.Float64()
	}
	return f
}

// BenchmarkHotPath is the engine's cost work for a statement in explain mode auto with a cached
// plan cost: "decide" on the decision path only, "statement" with Observe at completion too.
// "separate" is the three calls the engine made before Forecast (three locks, three
// lookups): Volatile, PlanCache.Get, Predict; "combined" is PlanCache.Get and Forecast.
// No pattern is volatile (a volatile one would be explained), so every call runs each time.
func BenchmarkHotPath(b *testing.B) {
	predicts := []struct {
		name    string
		predict func(m *Model, c *PlanCache, now time.Time, fp uint64) (planCost, seconds float64, volatile bool)
	}{
		{"separate", func(m *Model, c *PlanCache, now time.Time, fp uint64) (float64, float64, bool) {
			volatile := m.Volatile(fp)
			pc, _ := c.Get(now, fp)
			s, _ := m.Predict(fp, pc)
			return pc, s, volatile
		}},
		{"combined", func(m *Model, c *PlanCache, now time.Time, fp uint64) (float64, float64, bool) {
			pc, _ := c.Get(now, fp)
			f := m.Forecast(fp, pc)
			return pc, f.Seconds, f.Volatile
		}},
	}
	f := noise(1024)
	for _, observe := range []bool{false, true} {
		for _, p := range predicts {
			name := "decide/" + p.name
			if observe {
				name = "statement/" + p.name
			}
			b.Run(name, func(b *testing.B) {
				m, c, now := trainedHotPath()
				b.ReportAllocs()
				var sink float64
				for i := uint64(0); b.Loop(); i++ {
					fp := i % hotPathPatterns
					pc, s, volatile := p.predict(m, c, now, fp)
					if volatile {
						b.Fatal("volatile pattern in the benchmark")
					}
					sink += s
					if observe {
						m.Observe(fp, pc, s*f[i%uint64(len(f))])
					}
				}
				_ = sink
			})
		}
	}
}

// BenchmarkModelObserveTrained is Observe on a warm table (every pattern known, buckets full)
// with plan costs that jump between ranges from one execution to the next: the worst case for
// finding the bucket to train.
func BenchmarkModelObserveTrained(b *testing.B) {
	m, _, _ := trainedHotPath()
	rng := rand.New(rand.NewPCG(3, 4))
	var plans, actuals [1024]float64
	for i := range plans {
		plans[i] = 1500 + 1500*rng.Float64()
		actuals[i] = plans[i] * 3e-6 * (0.8 + 0.4*rng.Float64())
	}
	b.ReportAllocs()
	for i := uint64(0); b.Loop(); i++ {
		j := i % uint64(len(plans))
		m.Observe(i%hotPathPatterns, plans[j], actuals[j])
	}
}
