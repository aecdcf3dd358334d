package health

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
)

// TestFollowerKeepsTheLastSampleThroughAFailedRead: a follower follows the rule of a sampler
// that reads for itself. When the elected sampler publishes a failed read, the follower's last
// adopted value stands until it is StaleIntervals intervals old, and the metric is stale from
// then on (exceeded for an enforce budget).
func TestFollowerKeepsTheLastSampleThroughAFailedRead(t *testing.T) {
	aq := vocab.MetricActiveQueries
	th := map[string]float64{aq: 8}
	clock := fakeclock.New()
	el := &fixed{Vote{Published: []Shared{{Metric: aq, Value: 1}}}}
	var dials atomic.Int32
	s, _ := electedSampler(t, clock, el, &dials)
	_ = s.SampleOnce(context.Background()) // a healthy reading, read now

	el.v = Vote{Published: []Shared{{Metric: aq, Err: "connection lost"}}}
	clock.Advance(time.Second)
	_ = s.SampleOnce(context.Background())
	if m, _, exceeded, stale := s.Evaluate(clock.Now(), th, 0, true); exceeded || stale {
		t.Errorf("a failed published read after a 1s old sample: %q exceeded=%v stale=%v, want neither", m, exceeded, stale)
	}
	clock.Advance(StaleIntervals*time.Second - time.Second + time.Millisecond)
	_ = s.SampleOnce(context.Background())
	if m, _, exceeded, stale := s.Evaluate(clock.Now(), th, 0, true); m != aq || !exceeded || !stale {
		t.Errorf("failed published reads past three intervals: %q exceeded=%v stale=%v, want active_queries stale", m, exceeded, stale)
	}
	if dials.Load() != 0 {
		t.Error("a follower connected to the server")
	}
}
