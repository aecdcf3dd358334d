package engine

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// A statement admitted before its connection (BeginBeforeConn) holds pending slots, which a
// statement decided on its connection (Begin) overtakes; once it has its connection
// (Acquired) it runs if there is room, else it is decided again there.

// inFlight is the engine's first budget's slots in flight and statements waiting.
func inFlight(e *Engine) (inflight, waiting int) {
	s := e.state.Load().budgets[0].b.Snapshot(e.now())
	return s.InFlight, s.Waiting
}

func wantInFlight(t *testing.T, e *Engine, inflight, waiting int) {
	t.Helper()
	if i, w := inFlight(e); i != inflight || w != waiting {
		t.Fatalf("budget: %d in flight, %d waiting; want %d, %d", i, w, inflight, waiting)
	}
}

// TestPendingOvertakenThenAcquired: a statement on its connection overtakes the slot of one
// admitted before its connection; that one, once it has its connection, waits (max_wait) for
// the slot and runs after the overtaking one ends.
func TestPendingOvertakenThenAcquired(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1, max_wait: 10s}
rules:
  - {budget: a, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	pooled := new(Exec)
	pctx, err := e.BeginBeforeConn(ctx, pooled, "select 1", nil)
	if err != nil {
		t.Fatal(err)
	}
	held, err := begin(e, ctx, "select 2") // a statement on a held connection: not held up
	if err != nil {
		t.Fatalf("a statement on its connection was held up by a pending slot: %v", err)
	}
	wantInFlight(t, e, 2, 0)
	done := make(chan error, 1)
	go func() { done <- pooled.Acquired(pctx) }()
	waiting(t, clk, done) // overtaken: it waits for the running one's slot
	wantInFlight(t, e, 1, 1)
	held.Finish(ctx, nil)
	if err := <-done; err != nil {
		t.Fatalf("Acquired after the overtaking statement ended: %v", err)
	}
	wantInFlight(t, e, 1, 0)
	ended, cancel := context.WithCancel(ctx) // admitted at its first try, or not at all
	cancel()
	if _, err := begin(e, ended, "select 3"); err == nil {
		t.Fatal("a statement was admitted beside the running one in a budget of one slot")
	}
	pooled.Finish(pctx, nil)
	wantInFlight(t, e, 0, 0)
	if e.InFlight() != 0 {
		t.Fatalf("engine in flight %d, want 0", e.InFlight())
	}
}

// TestPendingAcquiredWithRoom: a statement admitted before its connection that is not
// overtaken runs at once when it has it, its slot a running one: a statement on its connection
// no longer overtakes it.
func TestPendingAcquiredWithRoom(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1}
rules:
  - {budget: a, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	pooled := new(Exec)
	pctx, err := e.BeginBeforeConn(ctx, pooled, "select 1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pooled.Acquired(pctx); err != nil {
		t.Fatal(err)
	}
	if pooled.st != nil {
		t.Fatal("the Exec keeps its rule set after Acquired")
	}
	if _, err := begin(e, ctx, "select 2"); err == nil {
		t.Fatal("a statement overtook a slot whose statement has its connection")
	}
	pooled.Finish(pctx, nil)
	wantInFlight(t, e, 0, 0)
}

// TestPendingOvertakenRefused: without max_wait, an overtaken statement is refused once it has
// its connection: a denial counted and recorded as any, its one decision (the admission before
// its connection is not counted besides), with nothing left held; Abandon then ends it.
func TestPendingOvertakenRefused(t *testing.T) {
	obs := &recObserver{}
	e, _ := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1}
  - {name: w, mode: warn, max_concurrent: 5}
rules:
  - {budget: a, match: {app: x}}
  - {budget: w, match: {app: x}}
`, func(o *Options) { o.Observer = obs })
	ctx := tagging.With(context.Background(), "app", "x")
	pooled := new(Exec)
	pctx, err := e.BeginBeforeConn(ctx, pooled, "select 1", nil)
	if err != nil {
		t.Fatal(err)
	}
	held, err := begin(e, ctx, "select 2")
	if err != nil {
		t.Fatal(err)
	}
	err = pooled.Acquired(pctx)
	if d := denial(t, err); d.Reason != vocab.ReasonConcurrency || d.Budget != "a" {
		t.Fatalf("denial %+v, want a's concurrency", d)
	}
	if pooled.Decision != DecisionBlock || len(pooled.holds) != 0 {
		t.Fatalf("refused: decision %q, %d holds; want block, none", pooled.Decision, len(pooled.holds))
	}
	wantInFlight(t, e, 1, 0)
	if s := e.state.Load().budgets[1].b.Snapshot(e.now()); s.InFlight != 1 {
		t.Fatalf("warn budget: %d in flight, want 1 (the running statement's)", s.InFlight)
	}
	pooled.Abandon(pctx, err)
	held.Finish(ctx, nil)
	wantInFlight(t, e, 0, 0)
	if e.InFlight() != 0 {
		t.Fatalf("engine in flight %d, want 0", e.InFlight())
	}
	if d := e.state.Load().budgets[0].b.Snapshot(e.now()).Decisions; d.Admitted != 1 || d.Blocked != 1 {
		t.Fatalf("budget a counted %d admitted, %d blocked; want 1, 1 (one decision per statement)", d.Admitted, d.Blocked)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	var ofA []string
	for _, d := range obs.decisions {
		if strings.HasPrefix(d, "a/") {
			ofA = append(ofA, d)
		}
	}
	if slices.Sort(ofA); !slices.Equal(ofA, []string{"a/allow/", "a/block/" + vocab.ReasonConcurrency}) {
		t.Fatalf("the observer counted %v for budget a, want one allow (the held statement) and one block", ofA)
	}
}

// TestPendingBatch: a batch admitted before its connection holds pending slots as a statement
// does: overtaken, it is refused once it has its connection without max_wait, and waits for
// the slot with one.
func TestPendingBatch(t *testing.T) {
	for _, maxWait := range []bool{false, true} {
		config := `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1}
rules:
  - {budget: a, match: {app: x}}
`
		if maxWait {
			config = `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1, max_wait: 10s}
rules:
  - {budget: a, match: {app: x}}
`
		}
		e, clk := newEngine(t, config)
		ctx := tagging.With(context.Background(), "app", "x")
		var b Batch
		if err := e.BeginBatchBeforeConn(ctx, &b, []string{"select 1", "select 2"}, nil); err != nil {
			t.Fatal(err)
		}
		held, err := begin(e, ctx, "select 3")
		if err != nil {
			t.Fatalf("a statement on its connection was held up by a batch's pending slot: %v", err)
		}
		if !maxWait {
			err := b.Acquired(ctx)
			if d := denial(t, err); d.Reason != vocab.ReasonConcurrency {
				t.Fatalf("denial %+v, want concurrency", d)
			}
			for i := range b.Execs {
				if b.Execs[i].Decision != DecisionBlock {
					t.Fatalf("statement %d: decision %q, want block", i, b.Execs[i].Decision)
				}
			}
			b.Abandon(ctx, err)
			held.Finish(ctx, nil)
		} else {
			done := make(chan error, 1)
			go func() { done <- b.Acquired(ctx) }()
			waiting(t, clk, done)
			held.Finish(ctx, nil)
			if err := <-done; err != nil {
				t.Fatalf("the batch after the overtaking statement ended: %v", err)
			}
			wantInFlight(t, e, 1, 0)
			b.Finish(ctx, nil)
		}
		wantInFlight(t, e, 0, 0)
		if e.InFlight() != 0 {
			t.Fatalf("max_wait %v: engine in flight %d, want 0", maxWait, e.InFlight())
		}
	}
}

// TestPendingOvertakenReload: an overtaken statement waiting for room on its connection when
// the rules are replaced leaves with ErrDecideAgain, holding nothing: the front end decides it
// afresh on its connection under the rules in force.
func TestPendingOvertakenReload(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1, max_wait: 10s}
rules:
  - {budget: a, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	pooled := new(Exec)
	pctx, err := e.BeginBeforeConn(ctx, pooled, "select 1", nil)
	if err != nil {
		t.Fatal(err)
	}
	held, err := begin(e, ctx, "select 2")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- pooled.Acquired(pctx) }()
	waiting(t, clk, done)
	reload(t, e, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 2, max_wait: 10s}
rules:
  - {budget: a, match: {app: x}}
`)
	if err := <-done; !errors.Is(err, ErrDecideAgain) {
		t.Fatalf("Acquired across a reload: %v, want ErrDecideAgain", err)
	}
	if len(pooled.holds) != 0 {
		t.Fatalf("%d holds after ErrDecideAgain, want none", len(pooled.holds))
	}
	pooled.Abandon(pctx, err)
	// The front end decides it again on its connection: admitted under the new rules.
	again, err := begin(e, ctx, "select 1")
	if err != nil {
		t.Fatalf("decided again under the new rules: %v", err)
	}
	wantInFlight(t, e, 2, 0)
	again.Finish(ctx, nil)
	held.Finish(ctx, nil)
	wantInFlight(t, e, 0, 0)
	if e.InFlight() != 0 {
		t.Fatalf("engine in flight %d, want 0", e.InFlight())
	}
}
