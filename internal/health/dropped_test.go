package health

import (
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
)

// TestEvaluateDroppedMetric: a reload that drops a metric from the set (SetMetrics) may still
// meet a statement decided by the rules it replaced, which throttle on that metric: for
// StaleIntervals intervals the metric neither throttles nor counts as stale for it, as the
// rules in force no longer hold statements to it. Past that, a threshold on a metric the
// sampler does not read counts as stale again, as it always did.
func TestEvaluateDroppedMetric(t *testing.T) {
	clock := fakeclock.New()
	log, _ := newLogger()
	s := NewSampler(Options{
		Interval: time.Second,
		Metrics:  []string{vocab.MetricActiveQueries, vocab.MetricReplicationLag},
		Logger:   log,
		Now:      clock.Now,
	})
	seed(t, s, vocab.MetricActiveQueries, 1, clock.Now())
	seed(t, s, vocab.MetricReplicationLag, 0, clock.Now())
	old := map[string]float64{vocab.MetricActiveQueries: 8, vocab.MetricReplicationLag: 5}
	if m, _, exceeded, stale := s.Evaluate(clock.Now(), old, 0, true); exceeded || stale {
		t.Fatalf("before the reload: %q exceeded=%v stale=%v, want neither", m, exceeded, stale)
	}
	s.SetMetrics([]string{vocab.MetricReplicationLag}, nil) // the reload drops active_queries
	clock.Advance(time.Second)
	seed(t, s, vocab.MetricReplicationLag, 0, clock.Now())
	if m, _, exceeded, stale := s.Evaluate(clock.Now(), old, 0, true); exceeded || stale {
		t.Errorf("the replaced rules just after the reload: %q exceeded=%v stale=%v, want neither", m, exceeded, stale)
	}
	clock.Advance(StaleIntervals*time.Second + time.Millisecond)
	seed(t, s, vocab.MetricReplicationLag, 0, clock.Now())
	if m, _, exceeded, stale := s.Evaluate(clock.Now(), old, 0, true); m != vocab.MetricActiveQueries || !exceeded || !stale {
		t.Errorf("long after the reload: %q exceeded=%v stale=%v, want active_queries stale (not read)", m, exceeded, stale)
	}
}
