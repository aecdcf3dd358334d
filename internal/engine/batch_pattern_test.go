package engine

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestBatchOfOnePatternTrains: the statements of a batch are not timed apart, but when they
// are all one pattern (sqlc's :batchexec and :batchmany send nothing else) the batch's time
// over its statements is that pattern's mean: the model trains on it, counting each statement,
// so that a per_query_limit comes to judge a pattern only ever sent in batches. A batch of
// several patterns, or one that failed, trains nothing.
func TestBatchOfOnePatternTrains(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: b, mode: enforce, per_query_limit: 100ms}
rules:
  - {budget: b, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	const q = "select pg_sleep($1)"
	p, _ := e.patterns.Get(q)
	var b Batch
	if err := e.BeginBatch(ctx, &b, nil, []string{q, q}, nil); err != nil {
		t.Fatal(err)
	}
	clk.Advance(600 * time.Millisecond)
	b.Finish(ctx, nil)
	s := modelStats(e, p.FingerprintID)
	if s.Count != 2 || math.Abs(s.MeanActual-0.3) > 0.01 {
		t.Fatalf("after a batch of two taking 0.6s: count %d, mean %.3fs; want 2 and 0.3s", s.Count, s.MeanActual)
	}
	d := denial(t, e.BeginBatch(ctx, &b, nil, []string{q}, nil))
	if d.Reason != vocab.ReasonPerQuery {
		t.Fatalf("a batch of the pattern learnt at 0.3s under a 100ms per_query_limit: %+v", d)
	}

	const other = "select v from t where id = $1"
	op, _ := e.patterns.Get(other)
	if err := e.BeginBatch(ctx, &b, nil, []string{other, "select 1"}, nil); err != nil {
		t.Fatal(err)
	}
	clk.Advance(50 * time.Millisecond)
	b.Finish(ctx, nil)
	if err := e.BeginBatch(ctx, &b, nil, []string{other, other}, nil); err != nil {
		t.Fatal(err)
	}
	clk.Advance(50 * time.Millisecond)
	b.Finish(ctx, []error{fmt.Errorf("server error")})
	if s := modelStats(e, op.FingerprintID); s.Count != 0 {
		t.Fatalf("a batch of two patterns, and a failed one, trained %d executions", s.Count)
	}
}

// TestBatchOfOnePatternOverrunStrikes: a batch cut off at its max_duration whose statements
// are all one pattern strikes that pattern, whichever of them was running.
func TestBatchOfOnePatternOverrunStrikes(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: r, mode: enforce, max_duration: 300ms, quarantine: {after: 1, for: 30s}}
rules:
  - {budget: r, match: {app: r}}
`)
	ctx := tagging.With(context.Background(), "app", "r")
	const q = "select pg_sleep($1)"
	var b Batch
	if err := e.BeginBatch(ctx, &b, nil, []string{q, q}, nil); err != nil {
		t.Fatal(err)
	}
	clk.Advance(300 * time.Millisecond)
	cut := fmt.Errorf("timeout: %w", ErrOverrun)
	b.Finish(ctx, []error{cut, cut})
	if d := denial(t, e.BeginBatch(ctx, &b, nil, []string{q, q}, nil)); d.Reason != vocab.ReasonQuarantine {
		t.Fatalf("a batch of one pattern that ran past max_duration: denial %+v, want a quarantine", d)
	}
}
