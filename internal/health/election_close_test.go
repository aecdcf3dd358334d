package health

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
)

// TestCloseDuringLeadRoundHandsOver: the lead closes while its round reads the server (the
// sampler's Close cancels the round). The round's read fails with it, the lead has no fresh
// reading and resigns, but under the cancelled context the resignation is never sent: the
// lease is still this instance's, and Close must resign it, so that another instance takes
// over at its next poll rather than when the lease lapses (two intervals, in which the
// followers' samples go stale and every statement under a health threshold is refused).
func TestCloseDuringLeadRoundHandsOver(t *testing.T) {
	clock := fakeclock.New()
	bb := &ballotBox{clock: clock}
	ctx, cancel := context.WithCancel(context.Background())
	log, _ := newLogger()
	s := NewSampler(Options{
		Connect: func(context.Context) (Conn, error) {
			cancel() // Close arrives while the round connects
			return nil, errors.New("dial: operation was canceled")
		},
		Interval: time.Second,
		Metrics:  []string{vocab.MetricActiveQueries},
		Logger:   log,
		Now:      clock.Now,
		Election: bb.voter("a"),
	})
	s.round(ctx, true)
	if bb.holder != "a" {
		t.Fatalf("the sampler did not lead (holder %q)", bb.holder)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("resign calls: %d; holder after Close: %q", bb.count("a", "resign"), bb.holder)
	if bb.holder != "" {
		t.Errorf("the lead closed and still holds the lease: its resignation under the round's cancelled context was never sent, and Close did not resign")
	}
}
