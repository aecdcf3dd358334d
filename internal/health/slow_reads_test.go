package health

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
)

// TestFailingReadsNeverStaleAHealthyMetric: six custom queries time out each round (a table
// locked by a migration: each read takes the server's statement_timeout), a seventh reads at
// once. The healthy one is read every round, before the failing ones, so it never goes stale
// however long the failing reads take; a round spends about an interval on the failing ones and
// leaves the rest for later rounds, trying the least recently tried first, so each is tried in
// turn and its metric goes stale as a failing read's does.
func TestFailingReadsNeverStaleAHealthyMetric(t *testing.T) {
	clock := fakeclock.New()
	timedOut := errors.New("canceling statement due to statement timeout")
	reads := map[string]fakeRead{"select fast": {v: 0}}
	queries := map[string]string{"fast": "select fast"}
	metrics := []string{"custom.fast"}
	for i := range 6 {
		sql := fmt.Sprintf("select slow_%d", i)
		name := fmt.Sprintf("slow_%d", i) // sorted after "fast": read after it on today's order too
		reads[sql] = fakeRead{v: 1}
		queries[name] = sql
		metrics = append(metrics, "custom."+name)
	}
	srv := &fakeServer{reads: reads, clock: clock}
	log, _ := newLogger()
	s := NewSampler(Options{Connect: srv.connect, Interval: time.Second, Timeout: 500 * time.Millisecond,
		Metrics: metrics, Queries: queries, Logger: log, Now: clock.Now})
	defer s.Close()
	if err := s.SampleOnce(context.Background()); err != nil {
		t.Fatalf("the first round, every read good: %v", err)
	}
	slow := map[string]fakeRead{"select fast": {v: 0}}
	for i := range 6 {
		slow[fmt.Sprintf("select slow_%d", i)] = fakeRead{err: timedOut, took: 333 * time.Millisecond}
	}
	srv.answer(slow)
	tried := map[string]int{}
	for round := range 12 {
		start := clock.Now()
		_ = s.SampleOnce(context.Background())
		if _, at, ok := s.Value("custom.fast"); !ok || !at.Equal(start) {
			t.Fatalf("round %d: custom.fast read at %v, want at the round's start %v", round, at, start)
		}
		if took := clock.Now().Sub(start); took > time.Second+333*time.Millisecond {
			t.Fatalf("round %d took %v: past its interval by more than one read", round, took)
		}
		m, _, _, stale := s.Evaluate(clock.Now(), map[string]float64{"custom.fast": 5}, 0, true)
		if stale {
			t.Fatalf("round %d: %s counts as stale", round, m)
		}
		for i := range 6 {
			name := fmt.Sprintf("custom.slow_%d", i)
			if r := s.snap.Load().readings[name]; r.err != "" && r.at.Before(start) {
				tried[name]++ // failed, its last good sample older than this round
			}
		}
		if clock.Now().Sub(start) < time.Second {
			clock.Advance(time.Second - clock.Now().Sub(start)) // the next round is due an interval after this one's start
		}
	}
	if len(tried) != 6 {
		t.Errorf("failing metrics tried: %v, want all six in turn", tried)
	}
	if _, _, exceeded, stale := s.Evaluate(clock.Now(), map[string]float64{"custom.slow_0": 5}, 0, true); !exceeded || !stale {
		t.Errorf("a metric whose reads fail: exceeded=%v stale=%v, want stale past three intervals", exceeded, stale)
	}
}
