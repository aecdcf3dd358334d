package engine

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// The smallest enforce max_duration is the statement's bound; a cancelled overrun is counted as
// its budget's max_duration block, a run past a warn budget's bound as that budget's warning;
// a budget without max_duration sets no bound.
func TestMaxDuration(t *testing.T) {
	obs := &recObserver{}
	e, clk := newEngine(t, `
budgets:
  - {name: short, mode: enforce, max_duration: 300ms}
  - {name: long, mode: enforce, max_duration: 2s}
  - {name: seen, mode: warn, max_duration: 100ms}
  - {name: free, mode: enforce, max_concurrent: 5}
rules:
  - {budget: long, match: {app: r}}
  - {budget: short, match: {app: r, tier: low}}
  - {budget: seen, match: {app: a}}
  - {budget: free, match: {app: f}}
`, func(o *Options) { o.Observer = obs })
	ctx := context.Background()
	for _, tt := range []struct {
		tags  []string
		bound time.Duration
	}{
		{[]string{"app", "r"}, 2 * time.Second},
		{[]string{"app", "r", "tier", "low"}, 300 * time.Millisecond},
		{[]string{"app", "a"}, 0}, // warn: no cancel
		{[]string{"app", "f"}, 0},
		{nil, 0},
	} {
		x, err := begin(e, tagging.With(ctx, tt.tags...), "select 1")
		if err != nil {
			t.Fatal(err)
		}
		if x.MaxDuration != tt.bound {
			t.Errorf("%v: MaxDuration %v, want %v", tt.tags, x.MaxDuration, tt.bound)
		}
		x.Finish(ctx, nil)
	}

	low := tagging.With(ctx, "app", "r", "tier", "low")
	x, err := begin(e, low, "select pg_sleep(5)")
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(300 * time.Millisecond)
	x.Finish(ctx, fmt.Errorf("timeout: %w", ErrOverrun))
	if x.Decision != DecisionBlock || x.Reason != vocab.ReasonMaxDuration {
		t.Errorf("decision %s, reason %s", x.Decision, x.Reason)
	}
	if b := e.RecentBlocks(); len(b) != 1 || b[0].Budget != "short" || b[0].Reason != vocab.ReasonMaxDuration {
		t.Errorf("recent blocks %+v", b)
	}

	x, err = begin(e, tagging.With(ctx, "app", "a"), "select pg_sleep(1)")
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(150 * time.Millisecond)
	x.Finish(ctx, nil)
	for _, want := range []string{"short/block/max_duration", "seen/warn/max_duration"} {
		if !slices.Contains(obs.decisions, want) {
			t.Errorf("decisions %v lack %s", obs.decisions, want)
		}
	}
	if n := countOf(obs.decisions, "seen/warn/max_duration"); n != 1 {
		t.Errorf("seen warned %d times, want 1 (the run within its bound is not warned)", n)
	}
}

func countOf(xs []string, s string) int {
	n := 0
	for _, x := range xs {
		if x == s {
			n++
		}
	}
	return n
}

// A statement cancelled at its enforce budget's max_duration after it also ran past a smaller
// warn budget's is that budget's block, whatever the order of the two: the warning is counted,
// and the statement's decision (its span's) is the block.
func TestMaxDurationBlockOutranksWarning(t *testing.T) {
	obs := &recObserver{}
	e, clk := newEngine(t, `
budgets:
  - {name: cut, mode: enforce, max_duration: 300ms}
  - {name: seen, mode: warn, max_duration: 100ms}
rules:
  - {budget: cut, match: {app: r}}
  - {budget: seen, match: {app: r}}
`, func(o *Options) { o.Observer = obs })
	ctx := tagging.With(context.Background(), "app", "r")
	x, err := begin(e, ctx, "select pg_sleep(5)")
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(300 * time.Millisecond)
	x.Finish(ctx, fmt.Errorf("timeout: %w", ErrOverrun))
	if x.Decision != DecisionBlock || x.Reason != vocab.ReasonMaxDuration {
		t.Errorf("decision %s, reason %s; want block, max_duration", x.Decision, x.Reason)
	}
	for _, want := range []string{"cut/block/max_duration", "seen/warn/max_duration"} {
		if countOf(obs.decisions, want) != 1 {
			t.Errorf("decisions %v: want %s once", obs.decisions, want)
		}
	}
}
