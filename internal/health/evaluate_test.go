package health

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
)

func TestEvaluate(t *testing.T) {
	const sec = time.Second
	type seeded struct {
		metric string
		value  float64
		age    time.Duration // negative: in the future
		failed bool
	}
	tests := []struct {
		name       string
		seed       []seeded
		thresholds map[string]float64
		inFlight   float64
		enforce    bool
		at         time.Duration // evaluated at t0 + at (default an hour after configuration)

		metric   string
		value    float64
		exceeded bool
		stale    bool
	}{
		{name: "no thresholds", enforce: true},
		{
			name:       "below threshold",
			seed:       []seeded{{metric: vocab.MetricActiveQueries, value: 7}},
			thresholds: map[string]float64{vocab.MetricActiveQueries: 8},
			enforce:    true,
		},
		{
			name:       "at threshold is exceeded",
			seed:       []seeded{{metric: vocab.MetricActiveQueries, value: 8}},
			thresholds: map[string]float64{vocab.MetricActiveQueries: 8},
			metric:     vocab.MetricActiveQueries, value: 8, exceeded: true,
		},
		{
			name:       "above threshold, warn mode too",
			seed:       []seeded{{metric: vocab.MetricReplicationLag, value: 6.5, age: 2 * sec}},
			thresholds: map[string]float64{vocab.MetricReplicationLag: 5},
			metric:     vocab.MetricReplicationLag, value: 6.5, exceeded: true,
		},
		{
			name:       "in_flight below",
			thresholds: map[string]float64{vocab.MetricInFlight: 4},
			inFlight:   3,
			enforce:    true,
		},
		{
			name:       "in_flight at threshold, never stale",
			thresholds: map[string]float64{vocab.MetricInFlight: 4},
			inFlight:   4,
			metric:     vocab.MetricInFlight, value: 4, exceeded: true,
		},
		{
			name:       "exactly three intervals old is fresh",
			seed:       []seeded{{metric: vocab.MetricActiveQueries, value: 1, age: 3 * sec}},
			thresholds: map[string]float64{vocab.MetricActiveQueries: 8},
			enforce:    true,
		},
		{
			name:       "older than three intervals is stale and exceeded when enforcing",
			seed:       []seeded{{metric: vocab.MetricActiveQueries, value: 1, age: 3*sec + 1}},
			thresholds: map[string]float64{vocab.MetricActiveQueries: 8},
			enforce:    true,
			metric:     vocab.MetricActiveQueries, value: 1, exceeded: true, stale: true,
		},
		{
			name:       "stale is not exceeded in warn mode",
			seed:       []seeded{{metric: vocab.MetricActiveQueries, value: 1, age: 10 * sec}},
			thresholds: map[string]float64{vocab.MetricActiveQueries: 8},
			metric:     vocab.MetricActiveQueries, value: 1, stale: true,
		},
		{
			name:       "never sampled, configured less than three intervals ago: not yet stale",
			thresholds: map[string]float64{vocab.MetricReplicationLag: 5},
			enforce:    true,
			at:         2 * sec,
		},
		{
			name:       "never sampled is stale",
			thresholds: map[string]float64{vocab.MetricReplicationLag: 5},
			enforce:    true,
			metric:     vocab.MetricReplicationLag, exceeded: true, stale: true,
		},
		{
			name:       "failed read after a fresh sample evaluates that sample",
			seed:       []seeded{{metric: "custom.q", value: 2, age: 3 * sec}, {metric: "custom.q", failed: true}},
			thresholds: map[string]float64{"custom.q": 10},
			enforce:    true,
		},
		{
			name:       "failed read after a fresh sample over the threshold is exceeded, not stale",
			seed:       []seeded{{metric: "custom.q", value: 12, age: sec}, {metric: "custom.q", failed: true}},
			thresholds: map[string]float64{"custom.q": 10},
			metric:     "custom.q", value: 12, exceeded: true,
		},
		{
			name:       "failed read after a sample older than three intervals is stale",
			seed:       []seeded{{metric: "custom.q", value: 2, age: 3*sec + 1}, {metric: "custom.q", failed: true}},
			thresholds: map[string]float64{"custom.q": 10},
			enforce:    true,
			metric:     "custom.q", value: 2, exceeded: true, stale: true,
		},
		{
			name:       "failed read with no good sample ever is stale at once",
			seed:       []seeded{{metric: "custom.q", failed: true}},
			thresholds: map[string]float64{"custom.q": 10},
			enforce:    true,
			at:         sec,
			metric:     "custom.q", exceeded: true, stale: true,
		},
		{
			name:       "metric the sampler does not read is stale",
			thresholds: map[string]float64{"custom.other": 1},
			enforce:    true,
			metric:     "custom.other", exceeded: true, stale: true,
		},
		{
			name:       "future sample (clock stepped back) is fresh",
			seed:       []seeded{{metric: vocab.MetricActiveQueries, value: 9, age: -5 * sec}},
			thresholds: map[string]float64{vocab.MetricActiveQueries: 8},
			metric:     vocab.MetricActiveQueries, value: 9, exceeded: true,
		},
		{
			name: "first exceeded by name",
			seed: []seeded{{metric: vocab.MetricReplicationLag, value: 9}, {metric: vocab.MetricActiveQueries, value: 9}, {metric: "custom.q", value: 9}},
			thresholds: map[string]float64{
				vocab.MetricReplicationLag: 1, vocab.MetricActiveQueries: 1, "custom.q": 1, vocab.MetricInFlight: 1,
			},
			inFlight: 5,
			metric:   vocab.MetricActiveQueries, value: 9, exceeded: true,
		},
		{
			name:       "fresh exceeded wins over stale",
			seed:       []seeded{{metric: vocab.MetricReplicationLag, value: 9}},
			thresholds: map[string]float64{vocab.MetricReplicationLag: 1, vocab.MetricActiveQueries: 1},
			enforce:    true,
			metric:     vocab.MetricReplicationLag, value: 9, exceeded: true,
		},
		{
			name:       "first stale by name",
			seed:       []seeded{{metric: vocab.MetricActiveQueries, value: 0}},
			thresholds: map[string]float64{vocab.MetricActiveQueries: 8, vocab.MetricReplicationLag: 5, "custom.q": 3},
			enforce:    true,
			metric:     "custom.q", exceeded: true, stale: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log, _ := newLogger()
			clock := fakeclock.New() // never advanced: t0, when the metrics were configured
			s := NewSampler(Options{
				Interval: time.Second,
				Metrics:  []string{vocab.MetricActiveQueries, vocab.MetricReplicationLag, "custom.q", vocab.MetricInFlight},
				Queries:  map[string]string{"q": "select 1"},
				Logger:   log,
				Now:      clock.Now,
			})
			now := t0.Add(time.Hour)
			if tt.at != 0 {
				now = t0.Add(tt.at)
			}
			for _, sd := range tt.seed {
				if sd.failed {
					fail(t, s, sd.metric, "boom")
					continue
				}
				seed(t, s, sd.metric, sd.value, now.Add(-sd.age))
			}
			metric, value, exceeded, stale := s.Evaluate(now, tt.thresholds, tt.inFlight, tt.enforce)
			if metric != tt.metric || value != tt.value || exceeded != tt.exceeded || stale != tt.stale {
				t.Errorf("Evaluate = (%q, %v, %v, %v), want (%q, %v, %v, %v)",
					metric, value, exceeded, stale, tt.metric, tt.value, tt.exceeded, tt.stale)
			}
		})
	}
}

func TestEvaluateLogsStalenessOnce(t *testing.T) {
	log, logs := newLogger()
	s := NewSampler(Options{Interval: time.Second, Metrics: []string{vocab.MetricActiveQueries}, Logger: log})
	th := map[string]float64{vocab.MetricActiveQueries: 8}
	const stale = "metric is stale"

	seed(t, s, vocab.MetricActiveQueries, 1, t0)
	for i := range 5 {
		if _, _, exceeded, isStale := s.Evaluate(t0.Add(time.Duration(4+i)*time.Second), th, 0, true); !exceeded || !isStale {
			t.Fatalf("check %d at %ds: exceeded=%v stale=%v, want both", i, 4+i, exceeded, isStale)
		}
	}
	if n := logs.count(stale); n != 1 {
		t.Fatalf("staleness logged %d times over 5 checks, want 1:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), "last good sample is 4s old") {
		t.Errorf("staleness log does not say how old the sample is:\n%s", logs)
	}

	// A good read ends the staleness; the next staleness is logged again.
	seed(t, s, vocab.MetricActiveQueries, 1, t0.Add(10*time.Second))
	if n := logs.count("metric read again"); n != 1 {
		t.Errorf("recovery logged %d times, want 1:\n%s", n, logs)
	}
	if _, _, exceeded, _ := s.Evaluate(t0.Add(11*time.Second), th, 0, true); exceeded {
		t.Fatal("fresh sample below threshold is exceeded")
	}
	fail(t, s, vocab.MetricActiveQueries, "timed out after 500ms")
	if _, _, exceeded, isStale := s.Evaluate(t0.Add(11*time.Second), th, 0, true); exceeded || isStale {
		t.Fatalf("a failed read after a 1s old sample: exceeded=%v stale=%v, want neither", exceeded, isStale)
	}
	s.Evaluate(t0.Add(14*time.Second), th, 0, true)
	s.Evaluate(t0.Add(14*time.Second), th, 0, true)
	if n := logs.count(stale); n != 2 {
		t.Fatalf("staleness logged %d times after a second episode, want 2:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), "last good sample is 4s old (stale after 3s); last read failed: timed out after 500ms") {
		t.Errorf("staleness log does not give the sample's age and the read error:\n%s", logs)
	}

	// Thresholds on a metric that is not sampled at all: once per metric set.
	other := map[string]float64{"custom.nope": 1}
	s.Evaluate(t0, other, 0, true)
	s.Evaluate(t0, other, 0, true)
	if n := logs.count("does not read"); n != 1 {
		t.Errorf("unconfigured metric logged %d times, want 1:\n%s", n, logs)
	}
}

func TestEvaluateConcurrentWithPublish(t *testing.T) {
	log, _ := newLogger()
	s := NewSampler(Options{Interval: time.Second, Metrics: []string{vocab.MetricActiveQueries}, Logger: log})
	th := map[string]float64{vocab.MetricActiveQueries: 1000}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 1000 {
			seed(t, s, vocab.MetricActiveQueries, float64(i), t0)
		}
	}()
	for range 1000 {
		if _, _, exceeded, _ := s.Evaluate(t0, th, 0, true); exceeded {
			// Never sampled or at most 999: a stale start is the only way to be exceeded.
			if v, _, ok := s.Value(vocab.MetricActiveQueries); ok && v >= 1000 {
				t.Fatalf("value %v out of range", v)
			}
		}
	}
	<-done
	if v, at, ok := s.Value(vocab.MetricActiveQueries); !ok || v != 999 || !at.Equal(t0) {
		t.Errorf("Value = (%v, %v, %v), want (999, %v, true)", v, at, ok, t0)
	}
}

func BenchmarkEvaluate(b *testing.B) {
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("thresholds=%d", n), func(b *testing.B) {
			log, _ := newLogger()
			s := NewSampler(Options{Interval: time.Second, Metrics: []string{vocab.MetricActiveQueries, vocab.MetricReplicationLag}, Logger: log})
			seed(b, s, vocab.MetricActiveQueries, 3, t0)
			seed(b, s, vocab.MetricReplicationLag, 0.2, t0)
			th := map[string]float64{vocab.MetricActiveQueries: 8, vocab.MetricReplicationLag: 5, vocab.MetricInFlight: 10}
			if n == 1 {
				th = map[string]float64{vocab.MetricActiveQueries: 8}
			}
			now := t0.Add(time.Second)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, _, exceeded, _ := s.Evaluate(now, th, 2, true); exceeded {
						b.Fatal("exceeded")
					}
				}
			})
		})
	}
}

func BenchmarkValue(b *testing.B) {
	log, _ := newLogger()
	s := NewSampler(Options{Interval: time.Second, Metrics: []string{vocab.MetricActiveQueries}, Logger: log})
	seed(b, s, vocab.MetricActiveQueries, 3, t0)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, _, ok := s.Value(vocab.MetricActiveQueries); !ok {
				b.Fatal("no value")
			}
		}
	})
}
