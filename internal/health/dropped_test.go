package health

import (
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// TestEvaluateDroppedMetric: a reload that drops a metric from the set (SetMetrics) may still
// meet a statement decided by the rules it replaced, which throttle on that metric: for
// StaleIntervals intervals the metric neither throttles nor counts as stale for it, as the
// rules in force no longer hold statements to it. Past that, a threshold on a metric the
// sampler does not read counts as stale again, as it always did.
func TestEvaluateDroppedMetric(t *testing.T) {
	now := t0
	log, _ := newLogger()
	s := NewSampler(Options{
		Interval: time.Second,
		Metrics:  []string{vocab.MetricActiveQueries, vocab.MetricReplicationLag},
		Logger:   log,
		Now:      func() time.Time { return now },
	})
	seed(t, s, vocab.MetricActiveQueries, 1, now)
	seed(t, s, vocab.MetricReplicationLag, 0, now)
	old := map[string]float64{vocab.MetricActiveQueries: 8, vocab.MetricReplicationLag: 5}
	if m, _, exceeded, stale := s.Evaluate(now, old, 0, true); exceeded || stale {
		t.Fatalf("before the reload: %q exceeded=%v stale=%v, want neither", m, exceeded, stale)
	}
	s.SetMetrics([]string{vocab.MetricReplicationLag}, nil) // the reload drops active_queries
	now = now.Add(time.Second)
	seed(t, s, vocab.MetricReplicationLag, 0, now)
	if m, _, exceeded, stale := s.Evaluate(now, old, 0, true); exceeded || stale {
		t.Errorf("the replaced rules just after the reload: %q exceeded=%v stale=%v, want neither", m, exceeded, stale)
	}
	now = now.Add(StaleIntervals*time.Second + time.Millisecond)
	seed(t, s, vocab.MetricReplicationLag, 0, now)
	if m, _, exceeded, stale := s.Evaluate(now, old, 0, true); m != vocab.MetricActiveQueries || !exceeded || !stale {
		t.Errorf("long after the reload: %q exceeded=%v stale=%v, want active_queries stale (not read)", m, exceeded, stale)
	}
}
