package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// modelCount is the number of executions the model has trained pattern fp on.
func modelCount(e *Engine, fp uint64) uint64 { return modelStats(e, fp).Samples }

// modelStats is what the model reports of pattern fp.
func modelStats(e *Engine, fp uint64) cost.PatternStats {
	for _, s := range e.model.Top(time.Time{}, 1<<20) {
		if s.Fingerprint == fp {
			return s
		}
	}
	return cost.PatternStats{}
}

// TestTrainingSampled: a pattern trains on each of its first warmSamples executions, then on
// about one in trainEvery of those predicted cheap, chosen before they run (a mostly fast
// pattern with slow outliers learns its mean), and always on one predicted at trainAlways or
// more; a failed statement never trains.
func TestTrainingSampled(t *testing.T) {
	const q = "select * from orders where id = $1"
	e, clk := newEngine(t, `
budgets:
  - {name: b, mode: enforce, per_query_limit: 1000s, explain: pattern}
rules:
  - {budget: b, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	p, _ := e.patterns.Get(q)
	fp := p.FingerprintID
	e.model.PutPlan(clk.Now(), fp, 8.3) // as an EXPLAIN would: there is no server here
	runN := func(n int, d time.Duration, err error) {
		t.Helper()
		for range n {
			x, berr := begin(e, ctx, q)
			if berr != nil {
				t.Fatal(berr)
			}
			clk.Advance(d)
			x.Finish(ctx, err)
		}
	}
	cheap := 100 * time.Microsecond
	runN(warmSamples, cheap, nil)
	if got := modelCount(e, fp); got != warmSamples {
		t.Fatalf("after %d cheap statements the model trained %d times, want every one", warmSamples, got)
	}
	const n = 8000
	runN(n, cheap, nil)
	got := modelCount(e, fp) - warmSamples
	if lo, hi := uint64(n/trainEvery*8/10), uint64(n/trainEvery*12/10); got < lo || got > hi {
		t.Fatalf("after %d more cheap statements the model trained %d times, want about %d", n, got, n/trainEvery)
	}
	// Each sample stands for trainEvery executions: the count the status page shows (and ranks
	// the hottest patterns by) is the executions', not the samples'.
	if runs, want := modelStats(e, fp).Count, uint64(warmSamples+n); runs < want*8/10 || runs > want*12/10 {
		t.Fatalf("the model counts %d executions after %d, want about that", runs, want)
	}
	// A pattern mostly fast with slow outliers (one in ten takes 3ms, the rest 0.5ms: a mean of
	// 0.75ms) learns its mean, not its outliers': choosing the samples by what they took (every
	// slow one, a sixteenth of the fast) would weigh the outliers sixteen times over (2.1ms).
	var sum float64
	const mixed = 4000
	for i := range mixed {
		d := 500 * time.Microsecond
		if i%10 == 0 {
			d = 3 * time.Millisecond
		}
		runN(1, d, nil)
		sum += modelMean(e, fp)
	}
	if mean := sum / mixed; mean < 0.5e-3 || mean > 1.0e-3 {
		t.Fatalf("a pattern of 0.5ms with one 3ms outlier in ten learned a mean of %.2fms on average, want about 0.75ms", mean*1e3)
	}
	// Predicted at trainAlways or more: every statement trains, once the prediction says so.
	runN(400, 5*trainAlways, nil)
	before := modelCount(e, fp)
	runN(100, 5*trainAlways, nil)
	if got := modelCount(e, fp) - before; got != 100 {
		t.Fatalf("100 statements predicted at %v trained %d times, want 100", 5*trainAlways, got)
	}
	before = modelCount(e, fp)
	runN(100, 5*trainAlways, errors.New("failed"))
	if got := modelCount(e, fp) - before; got != 0 {
		t.Fatalf("100 failed statements trained %d times, want 0", got)
	}
}

// modelMean is the model's mean actual seconds of pattern fp (0: not in the table).
func modelMean(e *Engine, fp uint64) float64 {
	for _, s := range e.model.Top(time.Time{}, 1<<20) {
		if s.Fingerprint == fp {
			return s.MeanActual
		}
	}
	return 0
}
