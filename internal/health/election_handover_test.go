package health

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
)

// TestLeadThatCannotReadHandsOver: two instances share an election. The first to
// vote, a, leads, but cannot connect to the server (its network to PostgreSQL is cut, its
// password rotated, its pg_hba line missing); b can, and the server is healthy (active_queries
// reads 1 under a threshold of 8). A lead that cannot read is no sampler: within a few
// intervals b must have a fresh reading of the server (taking the lease over, or sampling for
// itself), rather than reading "not connected" from a for as long as a lives.
func TestLeadThatCannotReadHandsOver(t *testing.T) {
	clock := fakeclock.New()
	bb := &ballotBox{clock: clock}
	var dials atomic.Int32
	a, _ := electedSampler(t, clock, bb.voter("a"), &dials)
	srv := &fakeServer{}
	log, _ := newLogger()
	b := NewSampler(Options{Connect: srv.connect, Interval: time.Second, Metrics: []string{vocab.MetricActiveQueries},
		Logger: log, Now: clock.Now, Election: bb.voter("b")})
	t.Cleanup(func() { b.Close() })

	ctx := context.Background()
	due := map[*Sampler]time.Time{a: clock.Now(), b: clock.Now().Add(10 * time.Millisecond)}
	thresholds := map[string]float64{vocab.MetricActiveQueries: 8}
	var staleFor time.Duration
	start := clock.Now()
	for clock.Now().Sub(start) < 30*time.Second {
		for _, s := range []*Sampler{a, b} {
			if !clock.Now().Before(due[s]) {
				next, _ := s.round(ctx, false)
				if next <= 0 {
					next = time.Second
				}
				due[s] = clock.Now().Add(next)
			}
		}
		if _, _, _, stale := b.Evaluate(clock.Now(), thresholds, 0, true); stale {
			staleFor += 50 * time.Millisecond
		} else {
			staleFor = 0
		}
		clock.Advance(50 * time.Millisecond)
	}
	_, _, exceeded, stale := b.Evaluate(clock.Now(), thresholds, 0, true)
	t.Logf("after 30 intervals: a dialled %d times (every one failed), b opened %d connections; b stale=%v exceeded=%v, stale for the last %v",
		dials.Load(), len(srv.opened()), stale, exceeded, staleFor)
	if stale || exceeded {
		t.Errorf("b, which can read a healthy server, still counts health as stale after 30 intervals (for %v): the lead a, which cannot connect, kept the lease and published only failures", staleFor)
	}
}
