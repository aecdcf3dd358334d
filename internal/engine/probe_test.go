package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"

	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestTooCostlyPredictionIsProbed: a pattern whose learned cost exceeds its budget's burst
// (its first execution ran slow) is refused as never fitting, but not for good: once
// cost.Relearn after the first such refusal one statement runs as a probe, bounded by the
// burst, while the others are still refused; a probe that finishes in time teaches the pattern
// its cost anew, and the pattern is admitted again. A probe that runs past the bound is
// cancelled as a statement past its max_duration is (counted as a block for max_duration), and
// is no lesson: the pattern stays refused until the next probe.
func TestTooCostlyPredictionIsProbed(t *testing.T) {
	for _, cut := range []bool{false, true} {
		t.Run(fmt.Sprintf("cut off %v", cut), func(t *testing.T) {
			e, clk := newEngine(t, coldRules) // tight: server_share 0.5, burst 0.5 s
			ctx := tagging.With(context.Background(), "app", "tight")
			const q = "select * from slow_start where id = $1"
			if err := run(e, clk, ctx, q, 2*time.Second); err != nil { // learned: 2 s > the burst
				t.Fatal(err)
			}
			refused := func(when string) {
				t.Helper()
				x, err := begin(e, ctx, q)
				if err == nil {
					t.Fatalf("%s: admitted (probe %v, max duration %v), want refused as never fitting", when, x.probe, x.MaxDuration)
				}
				if d := denial(t, err); d.Reason != vocab.ReasonPerQuery || d.RetryAfter != 0 {
					t.Fatalf("%s: %+v, want reason %s without a RetryAfter", when, d, vocab.ReasonPerQuery)
				}
			}
			refused("after the slow start")
			clk.Advance(cost.Relearn - time.Nanosecond)
			refused("just before Relearn")
			clk.Advance(time.Nanosecond)
			probe, err := begin(e, ctx, q)
			if err != nil {
				t.Fatalf("Relearn after the first refusal: %v, want a probe", err)
			}
			if !probe.probe || probe.MaxDuration != 500*time.Millisecond {
				t.Fatalf("the probe: probe %v, max duration %v, want a probe bounded by the 500ms burst", probe.probe, probe.MaxDuration)
			}
			refused("beside the probe")
			if n := e.Stats().Probes.Load(); n != 1 {
				t.Fatalf("%d probes counted, want 1", n)
			}
			if cut {
				clk.Advance(probe.MaxDuration)
				probe.Finish(ctx, fmt.Errorf("cancelled: %w", ErrOverrun))
				if probe.Decision != DecisionBlock || probe.Reason != vocab.ReasonMaxDuration {
					t.Fatalf("the probe cut off: decision %s, reason %s, want a block for max_duration", probe.Decision, probe.Reason)
				}
				if d := budgetNamed(t, e, "tight").b.Snapshot(clk.Now()).Decisions; d.BlockedBy[vocab.ReasonMaxDuration] != 1 {
					t.Fatalf("the budget counted %v, want the cut-off probe as one block for max_duration", d.BlockedBy)
				}
				refused("after a probe cut off at its bound")
				clk.Advance(cost.Relearn)
				again, err := begin(e, ctx, q)
				if err != nil || !again.probe {
					t.Fatalf("Relearn after the first probe: %v, want another probe", err)
				}
				again.Finish(ctx, nil)
				return
			}
			clk.Advance(10 * time.Millisecond)
			probe.Finish(ctx, nil)
			x, err := begin(e, ctx, q)
			if err != nil {
				t.Fatalf("after a probe of 10ms: %v, want admitted", err)
			}
			if x.probe || x.Predicted < 0.009 || x.Predicted > 0.011 {
				t.Fatalf("after a probe of 10ms: probe %v, predicted %v s, want no probe and the probe's 10ms", x.probe, x.Predicted)
			}
			x.Finish(ctx, nil)
		})
	}
}

// TestProbeRefusedForRoomIsNoProbe: the statement chosen as a pattern's probe may still find
// its bucket without room (another pattern's statements filled it): it is refused for that
// (reason budget), never runs, and is counted as no probe; Stats.Probes (the status page's and
// the metric's count of probes) counts the probes admitted.
func TestProbeRefusedForRoomIsNoProbe(t *testing.T) {
	e, clk := newEngine(t, coldRules) // tight: server_share 0.5, burst 0.5 s
	ctx := tagging.With(context.Background(), "app", "tight")
	const q = "select * from slow_start where id = $1"
	if err := run(e, clk, ctx, q, 2*time.Second); err != nil { // learned: 2 s > the burst
		t.Fatal(err)
	}
	if _, err := begin(e, ctx, q); denial(t, err).Reason != vocab.ReasonPerQuery {
		t.Fatal("the pattern is not refused as never fitting")
	}
	clk.Advance(cost.Relearn - time.Second)
	// Another pattern fills the bucket as the probe comes due.
	if err := run(e, clk, ctx, "select * from other_table where id = $1", time.Second); err != nil {
		t.Fatal(err)
	}
	_, err := begin(e, ctx, q)
	if d := denial(t, err); d.Reason != vocab.ReasonBudget {
		t.Fatalf("the probe's statement with the bucket full: %+v, want refused for room (reason budget)", d)
	}
	if n := e.Stats().Probes.Load(); n != 0 {
		t.Errorf("%d probes counted for a probe refused for room, which never ran; want 0", n)
	}
}
