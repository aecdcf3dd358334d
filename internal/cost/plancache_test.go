package cost

import (
	"math"
	"testing"
	"time"
)

func TestPlanCacheTTL(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	c := NewPlanCache(10, 0)
	if c.TTL() != DefaultPlanTTL {
		t.Fatalf("TTL = %v, want default %v", c.TTL(), DefaultPlanTTL)
	}
	c.Put(t0, 1, 123.5)
	tests := []struct {
		name   string
		now    time.Time
		fp     uint64
		want   float64
		wantOK bool
	}{
		{"just put", t0, 1, 123.5, true},
		{"within the TTL", t0.Add(59 * time.Second), 1, 123.5, true},
		{"at the TTL", t0.Add(60 * time.Second), 1, 0, false},
		{"after the TTL", t0.Add(time.Hour), 1, 0, false},
		{"clock before the put counts as fresh", t0.Add(-time.Second), 1, 123.5, true},
		{"unknown fingerprint", t0, 2, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := c.Get(tt.now, tt.fp)
			if got != tt.want || ok != tt.wantOK {
				t.Fatalf("Get = %v, %v; want %v, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
	t.Run("a new put restarts the TTL", func(t *testing.T) {
		c.Put(t0.Add(time.Hour), 1, 99)
		if got, ok := c.Get(t0.Add(time.Hour+30*time.Second), 1); !ok || got != 99 {
			t.Fatalf("Get = %v, %v; want 99, true", got, ok)
		}
	})
	t.Run("a custom TTL", func(t *testing.T) {
		c := NewPlanCache(10, time.Second)
		c.Put(t0, 1, 5)
		if _, ok := c.Get(t0.Add(999*time.Millisecond), 1); !ok {
			t.Fatal("entry expired before its TTL")
		}
		if _, ok := c.Get(t0.Add(time.Second), 1); ok {
			t.Fatal("entry outlived its TTL")
		}
	})
}

// TestPlanCacheTTLMatchesSub pins Get's expiry to the rule: an entry put at "at" is fresh at
// now if now.Sub(at) < ttl. Times come with a monotonic clock reading (from
// time.Now, as in the engine) and without one (injected clocks, Round(0)), in every mix, around
// the TTL boundary, before the put, and centuries away where Sub saturates.
func TestPlanCacheTTLMatchesSub(t *testing.T) {
	mono := time.Now()
	bases := []time.Time{
		mono,
		mono.Round(0), // the same instant without the monotonic reading
		time.Date(2026, 3, 1, 12, 0, 0, 999_999_999, time.UTC),
		time.Unix(0, 0),
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	ttls := []time.Duration{time.Nanosecond, time.Second, DefaultPlanTTL, 100 * time.Hour}
	offsets := func(ttl time.Duration) []time.Duration {
		return []time.Duration{0, 1, -1, ttl - 1, ttl, ttl + 1, -ttl, 2 * ttl, time.Minute,
			-time.Minute, 200 * 365 * 24 * time.Hour, -200 * 365 * 24 * time.Hour}
	}
	for _, ttl := range ttls {
		c := NewPlanCache(1, ttl)
		for _, at := range bases {
			for _, strip := range []bool{false, true} {
				c.Put(at, 1, 42)
				for _, d := range offsets(ttl) {
					now := at.Add(d)
					if strip {
						now = now.Round(0)
					}
					want := now.Sub(at) < ttl
					if _, got := c.Get(now, 1); got != want {
						t.Fatalf("ttl %v, put at %v, Get at %v (monotonic stripped %v): fresh %v, want %v",
							ttl, at, now, strip, got, want)
					}
				}
			}
		}
	}
}

func TestPlanCacheRejectsInvalidCost(t *testing.T) {
	now := time.Unix(1000, 0)
	c := NewPlanCache(10, time.Minute)
	for i, cost := range []float64{-1, math.NaN(), math.Inf(1)} {
		c.Put(now, uint64(i), cost)
	}
	if c.Len() != 0 {
		t.Fatalf("Len = %d after invalid puts, want 0", c.Len())
	}
	c.Put(now, 7, 0) // a zero-cost plan (e.g. WHERE false) is a valid cost
	if got, ok := c.Get(now, 7); !ok || got != 0 {
		t.Fatalf("Get = %v, %v; want 0, true", got, ok)
	}
}

func TestPlanCacheBound(t *testing.T) {
	const bound = 10_000
	start := time.Unix(1_000_000, 0)
	c := NewPlanCache(bound, time.Hour)
	for fp := uint64(0); fp < 1_000_000; fp++ {
		c.Put(start.Add(time.Duration(fp)*time.Microsecond), fp, float64(fp))
	}
	if c.Len() != bound {
		t.Fatalf("Len = %d, want %d", c.Len(), bound)
	}
	now := start.Add(time.Second)
	if _, ok := c.Get(now, 0); ok {
		t.Fatal("the oldest entry was not evicted")
	}
	if _, ok := c.Get(now, 1_000_000-bound-1); ok {
		t.Fatal("an entry older than the bound survived")
	}
	for _, fp := range []uint64{1_000_000 - bound, 999_999} {
		if got, ok := c.Get(now, fp); !ok || got != float64(fp) {
			t.Fatalf("Get(%d) = %v, %v; want %d, true", fp, got, ok, fp)
		}
	}
}

func TestPlanCacheEvictsOldestPut(t *testing.T) {
	now := time.Unix(0, 0)
	c := NewPlanCache(2, time.Hour)
	c.Put(now, 1, 1)
	c.Put(now, 2, 2)
	c.Put(now, 1, 10) // re-explained: now the newest
	c.Put(now, 3, 3)  // evicts 2, the entry put longest ago
	for _, tt := range []struct {
		fp     uint64
		wantOK bool
	}{{1, true}, {2, false}, {3, true}} {
		if _, ok := c.Get(now, tt.fp); ok != tt.wantOK {
			t.Fatalf("Get(%d) ok = %v, want %v", tt.fp, ok, tt.wantOK)
		}
	}
}

func TestPlanCacheGetAllocs(t *testing.T) {
	now := time.Unix(0, 0)
	c := NewPlanCache(0, 0)
	c.Put(now, 1, 1)
	if n := testing.AllocsPerRun(100, func() { c.Get(now, 1) }); n != 0 {
		t.Fatalf("Get allocates %v times, want 0", n)
	}
	m := NewModel(0)
	m.Observe(1, 10, 0.001)
	if n := testing.AllocsPerRun(100, func() { m.Predict(1, 10) }); n != 0 {
		t.Fatalf("Predict allocates %v times, want 0", n)
	}
}

func fillPlanCache() (*PlanCache, time.Time) {
	now := time.Now()
	c := NewPlanCache(0, 0)
	for fp := range uint64(DefaultMaxPatterns) {
		c.Put(now, fp, float64(fp))
	}
	return c, now
}

func BenchmarkPlanCacheGet(b *testing.B) {
	c, now := fillPlanCache()
	b.ReportAllocs()
	b.ResetTimer()
	var sink float64
	for i := 0; b.Loop(); i++ {
		v, _ := c.Get(now, uint64(i)%DefaultMaxPatterns)
		sink += v
	}
	_ = sink
}

func BenchmarkPlanCacheGetParallel(b *testing.B) {
	c, now := fillPlanCache()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var i uint64
		for pb.Next() {
			c.Get(now, i%DefaultMaxPatterns)
			i++
		}
	})
}

// BenchmarkDecisionCacheHit is the cost work on the decision path when the plan cost is cached:
// a plan-cache hit, the volatility check of explain mode auto, and a prediction.
func BenchmarkDecisionCacheHit(b *testing.B) {
	c, now := fillPlanCache()
	m := NewModel(0)
	for fp := range uint64(DefaultMaxPatterns) {
		m.Observe(fp, 1000, 0.003)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var i uint64
		for pb.Next() {
			fp := i % DefaultMaxPatterns
			if pc, ok := c.Get(now, fp); ok {
				m.Predict(fp, pc)
			}
			i++
		}
	})
}
