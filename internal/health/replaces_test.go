package health

import (
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
)

// TestNewSamplerReplaces: a sampler built to replace another (a reload that changed the
// interval) starts from its readings, as SetMetrics keeps them: a metric whose query is
// unchanged keeps its value and its date, so that a budget throttled on it stays
// throttled and a stale one stays stale until the new sampler reads (its age judged by the
// interval of the sampler that read it); a new metric is not read yet, and one no longer
// read is dropped as a reload drops it.
func TestNewSamplerReplaces(t *testing.T) {
	clock := fakeclock.New()
	log, _ := newLogger()
	old := NewSampler(Options{
		Interval: 500 * time.Millisecond,
		Metrics:  []string{vocab.MetricActiveQueries, vocab.MetricReplicationLag, "custom.a", "custom.b"},
		Queries:  map[string]string{"a": "select 1", "b": "select 2"},
		Logger:   log,
		Now:      clock.Now,
	})
	defer old.Close()
	// At t0+2s: active_queries is 0.5s old, custom.a 1.7s old (stale at the old interval,
	// fresh at the new), replication_lag was configured 2s ago and never read (stale at both).
	seed(t, old, vocab.MetricActiveQueries, 20, t0.Add(1500*time.Millisecond))
	seed(t, old, "custom.a", 7, t0.Add(300*time.Millisecond))
	seed(t, old, "custom.b", 1, t0.Add(1500*time.Millisecond))
	fail(t, old, "custom.b", "boom")

	clock.Advance(2 * time.Second) // to t0+2s
	s := NewSampler(Options{
		Interval: 600 * time.Millisecond,
		Metrics:  []string{vocab.MetricActiveQueries, vocab.MetricReplicationLag, "custom.a", "custom.c"},
		Queries:  map[string]string{"a": "select 1", "c": "select 3"},
		Logger:   log,
		Now:      clock.Now,
		Replaces: old,
	})
	defer s.Close()
	for _, tt := range []struct {
		name       string
		thresholds map[string]float64
		metric     string
		value      float64
		exceeded   bool
		stale      bool
	}{
		{"a throttling reading carries over", map[string]float64{vocab.MetricActiveQueries: 8},
			vocab.MetricActiveQueries, 20, true, false},
		{"its date carries over, judged at the interval that read it", map[string]float64{"custom.a": 8},
			"custom.a", 7, true, true},
		{"a metric never read stays stale", map[string]float64{vocab.MetricReplicationLag: 5},
			vocab.MetricReplicationLag, 0, true, true},
		{"a new metric is not read yet", map[string]float64{"custom.c": 1}, "", 0, false, false},
		{"a metric dropped just now does not throttle", map[string]float64{"custom.b": 1}, "", 0, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			metric, value, exceeded, stale := s.Evaluate(clock.Now(), tt.thresholds, 0, true)
			if metric != tt.metric || value != tt.value || exceeded != tt.exceeded || stale != tt.stale {
				t.Errorf("Evaluate = (%q, %v, %v, %v), want (%q, %v, %v, %v)",
					metric, value, exceeded, stale, tt.metric, tt.value, tt.exceeded, tt.stale)
			}
		})
	}
	if v, at, ok := s.Value(vocab.MetricActiveQueries); !ok || v != 20 || !at.Equal(t0.Add(1500*time.Millisecond)) {
		t.Errorf("Value(active_queries) = (%v, %v, %v), want (20, t0+1.5s, true)", v, at, ok)
	}
	// Once the new sampler reads custom.a, its interval judges the reading.
	seed(t, s, "custom.a", 7, clock.Now())
	if metric, _, _, stale := s.Evaluate(clock.Now().Add(1700*time.Millisecond), map[string]float64{"custom.a": 8}, 0, true); metric != "" || stale {
		t.Errorf("custom.a read by the new sampler 1.7s ago: Evaluate = (%q, stale %v), want fresh (1.8s at 600ms)", metric, stale)
	}
}

// TestNewSamplerReplacesLowered: a reload that lowers the interval does not make the sample it
// carries over stale: a reading 2.5s old, taken at a 5s interval (stale after 15s), stays in
// force under a sampler at 600ms (whose own readings are stale after 1.8s) until that sampler
// reads; a failed read of the new sampler leaves it in force too, as one after a good read
// does, and a good one is judged by the new interval.
func TestNewSamplerReplacesLowered(t *testing.T) {
	clock := fakeclock.New()
	log, _ := newLogger()
	opts := Options{
		Interval: 5 * time.Second,
		Metrics:  []string{"custom.knob"},
		Queries:  map[string]string{"knob": "select v from knob"},
		Logger:   log,
		Now:      clock.Now,
	}
	old := NewSampler(opts)
	defer old.Close()
	seed(t, old, "custom.knob", 1, t0)

	clock.Advance(2500 * time.Millisecond) // to t0+2.5s
	opts.Interval, opts.Replaces = 600*time.Millisecond, old
	s := NewSampler(opts)
	defer s.Close()
	th := map[string]float64{"custom.knob": 5}
	check := func(at time.Duration, wantStale bool) {
		t.Helper()
		metric, _, exceeded, stale := s.Evaluate(t0.Add(at), th, 0, true)
		if stale != wantStale || exceeded != wantStale {
			t.Errorf("at t0+%v: Evaluate = (%q, exceeded %v, stale %v), want stale %v", at, metric, exceeded, stale, wantStale)
		}
	}
	check(2500*time.Millisecond, false)
	fail(t, s, "custom.knob", "timed out after 300ms")
	check(14*time.Second, false) // the 5s sampler's value, 14s old
	check(16*time.Second, true)
	clock.Advance(13500 * time.Millisecond) // to t0+16s
	seed(t, s, "custom.knob", 1, clock.Now())
	check(17500*time.Millisecond, false)
	check(18*time.Second, true) // the new sampler's own reading, 2s old at 600ms
}
