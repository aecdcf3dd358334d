package health

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
)

// TestOlderSharedSampleNeverReplacesANewer: a writer of Redis who copied a healthy sample and
// puts it back after the lead published an unhealthy one makes the followers read the older
// sample again. Well-formed, plausible and not yet stale, it is older than the reading the
// follower holds: the follower keeps the newer one, and the limit it holds.
func TestOlderSharedSampleNeverReplacesANewer(t *testing.T) {
	aq := vocab.MetricActiveQueries
	clock := fakeclock.New()
	healthy := Shared{Metric: aq, Value: 0, Age: 100 * time.Millisecond}
	el := &fixed{Vote{Published: []Shared{healthy}}}
	var dials atomic.Int32
	s, _ := electedSampler(t, clock, el, &dials)
	_ = s.SampleOnce(context.Background())
	clock.Advance(time.Second)
	el.v.Published = []Shared{{Metric: aq, Value: 20, Age: 100 * time.Millisecond}} // the lead's next sample
	_ = s.SampleOnce(context.Background())
	clock.Advance(250 * time.Millisecond)
	healthy.Age += 1250 * time.Millisecond // the copy, put back: as old as it is
	el.v.Published = []Shared{healthy}
	_ = s.SampleOnce(context.Background())
	if _, v, exceeded, stale := s.Evaluate(clock.Now(), map[string]float64{aq: 8}, 0, true); !exceeded || stale || v != 20 {
		t.Errorf("after an older sample put back: value %v exceeded=%v stale=%v, want the newer reading 20, exceeded", v, exceeded, stale)
	}
	if s.Shared() != 2 {
		t.Errorf("shared samples taken %d, want 2 (the older one not taken)", s.Shared())
	}
}
