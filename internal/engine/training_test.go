package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// modelCount is the number of executions the model has trained pattern fp on.
func modelCount(e *Engine, fp uint64) uint64 {
	for _, s := range e.model.Top(time.Time{}, 1<<20) {
		if s.Fingerprint == fp {
			return s.Count
		}
	}
	return 0
}

// TestTrainingSampled: a pattern trains on each of its first warmSamples executions, then on
// about one in trainEvery cheap ones, and always on one that took trainAlways or longer; a failed
// statement never trains.
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
	before := modelCount(e, fp)
	runN(100, trainAlways, nil)
	if got := modelCount(e, fp) - before; got != 100 {
		t.Fatalf("100 statements of %v trained %d times, want 100", trainAlways, got)
	}
	before = modelCount(e, fp)
	runN(100, trainAlways, errors.New("failed"))
	if got := modelCount(e, fp) - before; got != 0 {
		t.Fatalf("100 failed statements trained %d times, want 0", got)
	}
}
