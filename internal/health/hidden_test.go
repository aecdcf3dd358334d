package health

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// TestActiveQueriesHiddenBackends: active_queries read by a role that cannot see the state of
// other roles' busy backends (its query returns no row) is a failed read naming what to grant,
// never a 0; it is logged once although it comes and goes with those backends' statements,
// and every failure is still counted.
func TestActiveQueriesHiddenBackends(t *testing.T) {
	log, logs := newLogger()
	srv := &fakeServer{reads: map[string]fakeRead{activeQueriesSQL: {v: 0}}}
	s := NewSampler(Options{Connect: srv.connect, Interval: time.Second,
		Metrics: []string{vocab.MetricActiveQueries}, Logger: log})
	defer s.Close()
	hidden := map[string]fakeRead{activeQueriesSQL: {err: ErrNoRows}}
	for range 3 {
		srv.answer(hidden)
		err := s.SampleOnce(context.Background())
		if err == nil || !strings.Contains(err.Error(), "health: active_queries: unknown:") ||
			!strings.Contains(err.Error(), "grant it pg_read_all_stats or pg_monitor") {
			t.Fatalf("SampleOnce = %v, want active_queries unknown, naming pg_read_all_stats and pg_monitor", err)
		}
		srv.answer(nil)
		if err := s.SampleOnce(context.Background()); err != nil {
			t.Fatalf("SampleOnce, no hidden backend busy = %v", err)
		}
	}
	if n := logs.count("grant it pg_read_all_stats or pg_monitor"); n != 1 {
		t.Errorf("the hidden backends were logged %d times, want once:\n%s", n, logs)
	}
	if n := logs.count("metric read again"); n != 0 {
		t.Errorf("the reads after them were logged %d times, want none:\n%s", n, logs)
	}
	if got := s.Errors(); got != 3 {
		t.Errorf("Errors() = %d, want 3", got)
	}
}
