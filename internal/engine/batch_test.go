package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

func budgetInFlight(t *testing.T, e *Engine, name string) int {
	t.Helper()
	for _, b := range e.Budgets() {
		if b.Name == name {
			return b.InFlight
		}
	}
	t.Fatalf("no budget %q", name)
	return 0
}

// TestBatchHoldsOneSlotPerBudget: a batch is admitted once against its budgets, taking one slot
// of each however many of its statements select it, and holds it until Finish.
func TestBatchHoldsOneSlotPerBudget(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1}
rules:
  - {budget: a, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	var b Batch
	if err := e.BeginBatch(ctx, &b, nil, []string{"select 1", "select 2", "select 3"}, nil); err != nil {
		t.Fatal(err)
	}
	if n := budgetInFlight(t, e, "a"); n != 1 {
		t.Fatalf("a in flight %d, want 1", n)
	}
	if _, err := begin(e, ctx, "select 4"); denial(t, err).Reason != ReasonConcurrency {
		t.Fatal("the batch should hold a's only slot")
	}
	for i := range b.Execs {
		if x := &b.Execs[i]; x.Decision != DecisionAllow || len(x.Budgets) != 1 || x.Budgets[0] != "a" {
			t.Fatalf("statement %d: %+v", i, x.Result)
		}
	}
	if e.InFlight() != 3 {
		t.Fatalf("engine in flight %d, want 3", e.InFlight())
	}
	b.Finish(ctx, nil)
	if n := budgetInFlight(t, e, "a"); n != 0 || e.InFlight() != 0 {
		t.Fatalf("after Finish: a %d, engine %d", n, e.InFlight())
	}
	// The ticket is reused: a second batch on it decides afresh.
	if err := e.BeginBatch(ctx, &b, nil, []string{"select 5"}, nil); err != nil || len(b.Execs) != 1 {
		t.Fatalf("reuse: %v, %d statements", err, len(b.Execs))
	}
	b.Finish(ctx, nil)
}

// TestBatchAllOrNothing: a batch whose statements select two budgets, one of them full, is
// refused and takes nothing from the other; every statement's result is the block.
func TestBatchAllOrNothing(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 5}
  - {name: b, mode: enforce, max_concurrent: 1}
rules:
  - {budget: a, match: {app: x}}
  - {budget: b, match: {table: big}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	hold, err := begin(e, context.Background(), "select * from big")
	if err != nil {
		t.Fatal(err)
	}
	var b Batch
	err = e.BeginBatch(ctx, &b, nil, []string{"select 1", "select * from big", "select 2"}, nil)
	if d := denial(t, err); d.Budget != "b" || d.Reason != ReasonConcurrency {
		t.Fatalf("denial %+v", d)
	}
	if a := budgetInFlight(t, e, "a"); a != 0 {
		t.Fatalf("a in flight %d after a refused batch", a)
	}
	for i := range b.Execs {
		if x := &b.Execs[i]; x.Decision != DecisionBlock || x.Reason != ReasonConcurrency {
			t.Fatalf("statement %d: %s %s", i, x.Decision, x.Reason)
		}
	}
	hold.Finish(context.Background(), nil)
	if err := e.BeginBatch(ctx, &b, nil, []string{"select 1", "select * from big"}, nil); err != nil {
		t.Fatal(err)
	}
	if a, bb := budgetInFlight(t, e, "a"), budgetInFlight(t, e, "b"); a != 1 || bb != 1 {
		t.Fatalf("in flight a %d b %d, want 1 and 1", a, bb)
	}
	b.Finish(ctx, nil)
}

// TestBatchGuardRefusesWhole: an unqualified DELETE anywhere in a batch refuses the batch.
func TestBatchGuardRefusesWhole(t *testing.T) {
	obs := &recObserver{}
	e, _ := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 5}
rules:
  - {budget: a, match: {app: x}}
guards: {require_where: enforce}
`, func(o *Options) { o.Observer = obs })
	ctx := tagging.With(context.Background(), "app", "x")
	var b Batch
	err := e.BeginBatch(ctx, &b, nil, []string{"insert into t values (1)", "delete from t", "select 1"}, nil)
	if d := denial(t, err); d.Reason != ReasonGuard {
		t.Fatalf("denial %+v", d)
	}
	for i := range b.Execs {
		if x := &b.Execs[i]; x.Decision != DecisionBlock || x.Start().IsZero() {
			t.Fatalf("statement %d: %s, start %v", i, x.Decision, x.Start())
		}
	}
	if a := budgetInFlight(t, e, "a"); a != 0 || e.InFlight() != 0 {
		t.Fatalf("in flight a %d engine %d", a, e.InFlight())
	}
	if got := e.Stats().Blocked.Load(); got != 1 {
		t.Fatalf("blocks recorded %d, want 1", got)
	}
	// WithGuardBypass lets the batch through, as it does a statement.
	if err := e.BeginBatch(WithGuardBypass(ctx), &b, nil, []string{"delete from t"}, nil); err != nil {
		t.Fatal(err)
	}
	b.Finish(ctx, nil)
}

// TestBatchSumOfCosts: per_query_limit judges the batch at the sum of its statements' costs.
func TestBatchSumOfCosts(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: r, mode: enforce, per_query_limit: 500ms}
rules:
  - {budget: r, match: {app: r}}
`)
	ctx := tagging.With(context.Background(), "app", "r")
	q := "select count(*) from events"
	for range 5 { // history: 300ms a run
		if err := run(e, clk, ctx, q, 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	var b Batch
	if err := e.BeginBatch(ctx, &b, nil, []string{q}, nil); err != nil {
		t.Fatalf("one statement of 300ms: %v", err)
	}
	b.Finish(ctx, nil)
	err := e.BeginBatch(ctx, &b, nil, []string{q, q}, nil)
	if d := denial(t, err); d.Reason != ReasonPerQuery {
		t.Fatalf("two statements of 300ms under a 500ms limit: %+v", d)
	}
}

// TestBatchMaxWaitContextEnds: a batch waiting for capacity returns ctx's error when ctx ends,
// holding nothing.
func TestBatchMaxWaitContextEnds(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1, max_wait: 10s}
rules:
  - {budget: a, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	hold, err := begin(e, ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		var b Batch
		done <- e.BeginBatch(cctx, &b, nil, []string{"select 2", "select 3"}, nil)
	}()
	<-clk.waiting // the batch waits
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	hold.Finish(ctx, nil)
	if a := budgetInFlight(t, e, "a"); a != 0 {
		t.Fatalf("a in flight %d", a)
	}
}

// TestBatchPanicGivesBack: an observer that panics while the batch is begun leaves nothing held.
func TestBatchPanicGivesBack(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1}
rules:
  - {budget: a, match: {app: x}}
`, func(o *Options) { o.Observer = &panicObserver{in: "Started"} })
	ctx := tagging.With(context.Background(), "app", "x")
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("no panic")
			}
		}()
		var b Batch
		_ = e.BeginBatch(ctx, &b, nil, []string{"select 1"}, nil)
	}()
	if a := budgetInFlight(t, e, "a"); a != 0 || e.InFlight() != 0 {
		t.Fatalf("after a panic: a %d engine %d", a, e.InFlight())
	}
}
