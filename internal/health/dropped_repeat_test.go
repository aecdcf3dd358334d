package health

import (
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
)

// Repeated SetMetrics: the dropped metric keeps its first drop time (no extension), and a
// re-added then re-dropped metric is dated by its last drop.
func TestDroppedRepeatedSetMetrics(t *testing.T) {
	clock := fakeclock.New()
	log, _ := newLogger()
	s := NewSampler(Options{Interval: time.Second,
		Metrics: []string{vocab.MetricActiveQueries, vocab.MetricReplicationLag}, Logger: log,
		Now: clock.Now})
	seed(t, s, vocab.MetricActiveQueries, 1, clock.Now())
	seed(t, s, vocab.MetricReplicationLag, 0, clock.Now())
	old := map[string]float64{vocab.MetricActiveQueries: 8}
	s.SetMetrics([]string{vocab.MetricReplicationLag}, nil)
	for i := 0; i < StaleIntervals; i++ {
		clock.Advance(time.Second)
		s.SetMetrics([]string{vocab.MetricReplicationLag}, nil)
		seed(t, s, vocab.MetricReplicationLag, 0, clock.Now())
	}
	clock.Advance(time.Millisecond)
	if _, _, _, stale := s.Evaluate(clock.Now(), old, 0, true); !stale {
		t.Errorf("dropped metric still exempt past StaleIntervals after repeated SetMetrics")
	}
	s.SetMetrics([]string{vocab.MetricReplicationLag, vocab.MetricActiveQueries}, nil)
	s.SetMetrics([]string{vocab.MetricReplicationLag}, nil)
	if _, _, exceeded, stale := s.Evaluate(clock.Now(), old, 0, true); exceeded || stale {
		t.Errorf("re-dropped metric: exceeded=%v stale=%v, want neither", exceeded, stale)
	}
}
