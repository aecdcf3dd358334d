package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"

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
	if _, err := begin(e, ctx, "select 4"); denial(t, err).Reason != vocab.ReasonConcurrency {
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
	if d := denial(t, err); d.Budget != "b" || d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("denial %+v", d)
	}
	if a := budgetInFlight(t, e, "a"); a != 0 {
		t.Fatalf("a in flight %d after a refused batch", a)
	}
	for i := range b.Execs {
		if x := &b.Execs[i]; x.Decision != DecisionBlock || x.Reason != vocab.ReasonConcurrency {
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

// TestBatchGuardRefusesWhole: an unqualified DELETE anywhere in a batch refuses the batch, each
// of its statements recorded as one refusal.
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
	if d := denial(t, err); d.Reason != vocab.ReasonGuard {
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
	// Each statement of the refused batch is one refusal, as the observer counts them and as a
	// budget's refusal of a batch records them.
	if got := e.Stats().Blocked.Load(); got != 3 {
		t.Fatalf("blocks recorded %d, want 3", got)
	}
	// WithGuardBypass lets the batch through, as it does a statement.
	if err := e.BeginBatch(WithGuardBypass(ctx), &b, nil, []string{"delete from t"}, nil); err != nil {
		t.Fatal(err)
	}
	b.Finish(ctx, nil)
}

// TestBatchPerQueryLimitPerStatement: per_query_limit, the limit of one statement, judges
// each statement of a batch, not their sum (which the bucket judges): two statements of 300ms
// pass a 500ms limit together; one of 300ms does not pass a 250ms limit, alone or among cheaper
// ones.
func TestBatchPerQueryLimitPerStatement(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: r, mode: enforce, per_query_limit: 500ms}
  - {name: tight, mode: enforce, per_query_limit: 250ms}
rules:
  - {budget: r, match: {app: r}}
  - {budget: tight, match: {app: tight}}
`)
	ctx := tagging.With(context.Background(), "app", "r")
	q := "select count(*) from events"
	for range 5 { // history: 300ms a run
		if err := run(e, clk, ctx, q, 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	var b Batch
	if err := e.BeginBatch(ctx, &b, nil, []string{q, q}, nil); err != nil {
		t.Fatalf("two statements of 300ms under a 500ms limit: %v", err)
	}
	clk.Advance(600 * time.Millisecond) // as they take: the model trains on the batch's mean
	b.Finish(ctx, nil)
	tight := tagging.With(context.Background(), "app", "tight")
	err := e.BeginBatch(tight, &b, nil, []string{"select 1", q}, nil)
	if d := denial(t, err); d.Reason != vocab.ReasonPerQuery {
		t.Fatalf("a statement of 300ms under a 250ms limit: %+v", d)
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
	waiting(t, clk, done) // the batch waits
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

// blockCounter is an observer that counts the statements it is told were blocked.
type blockCounter struct {
	recObserver
	blocked int
}

func (c *blockCounter) Blocked(ctx context.Context, x *Exec, err error) {
	c.blocked++
	c.recObserver.Blocked(ctx, x, err)
}

func decisionsOf(t *testing.T, e *Engine, name string) (admitted, blocked uint64, by map[string]uint64) {
	t.Helper()
	for _, b := range e.Budgets() {
		if b.Name == name {
			return b.Decisions.Admitted, b.Decisions.Blocked, b.Decisions.BlockedBy
		}
	}
	t.Fatalf("no budget %q", name)
	return 0, 0, nil
}

// TestBatchRefusalCountsEachStatement: a refused batch is one block per statement in the
// refusing budget's counts and in the recent refusals, as the observer is told of each.
func TestBatchRefusalCountsEachStatement(t *testing.T) {
	obs := &blockCounter{}
	e, _ := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1}
rules:
  - {budget: a, match: {app: x}}
`, func(o *Options) { o.Observer = obs })
	ctx := tagging.With(context.Background(), "app", "x")
	hold, err := begin(e, ctx, "select 0")
	if err != nil {
		t.Fatal(err)
	}
	var b Batch
	if d := denial(t, e.BeginBatch(ctx, &b, nil, []string{"select 1", "select 2", "select * from t"}, nil)); d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("denial %+v", d)
	}
	hold.Finish(ctx, nil)
	admitted, blocked, by := decisionsOf(t, e, "a")
	if obs.blocked != 3 || admitted != 1 || blocked != 3 || by[vocab.ReasonConcurrency] != 3 {
		t.Errorf("observer told of %d blocks; budget admitted %d, blocked %d %v: want 3 blocks in both", obs.blocked,
			admitted, blocked, by)
	}
	var groups uint64
	for _, g := range e.RecentBlocks() {
		groups += g.Count
	}
	if groups != 3 || e.Stats().Blocked.Load() != 3 {
		t.Errorf("recent refusals %d, blocks recorded %d: want 3", groups, e.Stats().Blocked.Load())
	}
}

// TestBatchZeroLimitAndQuarantine: a zero limit refuses a batch with a statement it selects
// (in warn mode, warns), and a quarantined pattern refuses the batch it is in, as each refuses
// the statement alone.
func TestBatchZeroLimitAndQuarantine(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: frozen, mode: enforce, max_concurrent: 0}
  - {name: closedwarn, mode: warn, server_share: 0}
  - {name: r, mode: enforce, max_duration: 300ms, quarantine: {after: 1, for: 30s}}
rules:
  - {budget: frozen, match: {table: audit}}
  - {budget: closedwarn, match: {table: notes}}
  - {budget: r, match: {app: r}}
`)
	ctx := context.Background()
	var b Batch
	d := denial(t, e.BeginBatch(ctx, &b, nil, []string{"select 1", "select * from audit"}, nil))
	if d.Budget != "frozen" || d.Reason != vocab.ReasonConcurrency {
		t.Errorf("zero limit: denial %+v", d)
	}
	if _, blocked, _ := decisionsOf(t, e, "frozen"); blocked != 2 {
		t.Errorf("frozen blocked %d, want 2", blocked)
	}

	if err := e.BeginBatch(ctx, &b, nil, []string{"select * from notes", "select 2"}, nil); err != nil {
		t.Fatal(err)
	}
	if x := &b.Execs[0]; x.Decision != DecisionWarn || x.Reason != vocab.ReasonBudget {
		t.Errorf("warn zero limit: statement 0 %s %s, want a budget warning", x.Decision, x.Reason)
	}
	b.Finish(ctx, nil)

	rctx := tagging.With(ctx, "app", "r")
	overrun(t, e, clk, rctx, "select pg_sleep(5)")
	d = denial(t, e.BeginBatch(rctx, &b, nil, []string{"select 1", "select pg_sleep(5)"}, nil))
	if d.Budget != "r" || d.Reason != vocab.ReasonQuarantine || d.RetryAfter <= 0 {
		t.Errorf("quarantine: denial %+v", d)
	}
	if err := e.BeginBatch(rctx, &b, nil, []string{"select 1", "select 2"}, nil); err != nil {
		t.Fatalf("a batch without the quarantined pattern: %v", err)
	}
	b.Finish(rctx, nil)
}

// TestBatchOverrunStrikesNobodyUnlessOnePattern: a batch cancelled at its max_duration cannot
// tell which of its statements was running (the server sends a pipeline's results at its end,
// so each reports the cancellation, those that had completed included): a batch of several
// patterns strikes none of them, for quarantining a cheap one would refuse it everywhere. A
// batch of one statement strikes it.
func TestBatchOverrunStrikesNobodyUnlessOnePattern(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: r, mode: enforce, max_duration: 300ms, quarantine: {after: 1, for: 30s}}
rules:
  - {budget: r, match: {app: r}}
`)
	ctx := tagging.With(context.Background(), "app", "r")
	var b Batch
	if err := e.BeginBatch(ctx, &b, nil, []string{"select now()", "select pg_sleep(5)", "select current_date"}, nil); err != nil {
		t.Fatal(err)
	}
	clk.Advance(300 * time.Millisecond)
	cut := fmt.Errorf("timeout: %w", ErrOverrun)
	b.Finish(ctx, []error{cut, cut, cut})
	for _, q := range []string{"select now()", "select pg_sleep(5)", "select current_date"} {
		if err := e.BeginBatch(ctx, &b, nil, []string{q}, nil); err != nil {
			t.Errorf("%s after a batch of three overran: %v, want no quarantine", q, err)
			continue
		}
		b.Finish(ctx, nil)
	}

	if err := e.BeginBatch(ctx, &b, nil, []string{"select pg_sleep(5)"}, nil); err != nil {
		t.Fatal(err)
	}
	clk.Advance(300 * time.Millisecond)
	b.Finish(ctx, []error{cut})
	d := denial(t, e.BeginBatch(ctx, &b, nil, []string{"select pg_sleep(5)"}, nil))
	if d.Reason != vocab.ReasonQuarantine {
		t.Errorf("a batch of one statement that ran past max_duration: denial %+v, want a quarantine", d)
	}
}
