package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// A statement or batch of the pool decided on a connection taken from the pool for it alone
// (BeginTaken, BeginBatchTaken, Acquired) does not wait for health holding that connection:
// it answers ErrWaitBeforeConn, holding nothing and refused by nothing, and is decided again
// before its connection, where it waits for health holding none.

// takenRules throttle on in_flight, the engine's own count: one statement running holds the
// others back.
const takenRules = `
budgets:
  - {name: a, mode: enforce, max_wait: 10s, throttle_when: {in_flight: 1}}
rules:
  - {budget: a, match: {app: x}}
`

// answered returns what the call run in done answered, failing the test if it waited for
// capacity (set a timer on clk) first.
func answered(t *testing.T, clk *fakeclock.Clock, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-clk.Set():
		t.Fatal("it waited for health on the connection taken for it")
	case <-time.After(10 * time.Second): // a watchdog only
		t.Fatal("it neither waited nor answered")
	}
	return nil
}

// wantNothingHeld fails the test unless e has only the statement running counted, and its
// budget counted no refusal.
func wantNothingHeld(t *testing.T, e *Engine) {
	t.Helper()
	if n := e.InFlight(); n != 1 {
		t.Errorf("%d statements in flight, want the running one only", n)
	}
	if p := e.pending.Load(); p != 0 {
		t.Errorf("%d statements pending, want 0", p)
	}
	if d := e.state.Load().budgets[0].b.Snapshot(e.now()).Decisions; d.Blocked != 0 {
		t.Errorf("%d refusals counted, want 0: the statement is decided again", d.Blocked)
	}
}

func TestTakenHeldBackForHealthWaitsBeforeConn(t *testing.T) {
	e, clk := newEngine(t, takenRules)
	ctx := tagging.With(context.Background(), "app", "x")
	running, err := begin(e, ctx, "select 2")
	if err != nil {
		t.Fatal(err)
	}
	x := new(Exec)
	done := make(chan error, 1)
	go func() { _, err := e.BeginTaken(ctx, x, nil, "select 1", nil); done <- err }()
	if err := answered(t, clk, done); !errors.Is(err, ErrWaitBeforeConn) {
		t.Fatalf("BeginTaken held back for health: %v, want ErrWaitBeforeConn", err)
	}
	wantNothingHeld(t, e)

	// Decided again before its connection, it waits for health there, holding none.
	var pctx context.Context
	go func() {
		var err error
		pctx, err = e.BeginBeforeConn(ctx, x, "select 1", nil)
		done <- err
	}()
	waiting(t, clk, done)
	running.Finish(ctx, nil)
	if err := <-done; err != nil {
		t.Fatalf("BeginBeforeConn once healthy: %v", err)
	}
	if err := x.Acquired(pctx); err != nil {
		t.Fatal(err)
	}
	x.Finish(pctx, nil)
}

func TestBatchTakenHeldBackForHealthWaitsBeforeConn(t *testing.T) {
	e, clk := newEngine(t, takenRules)
	ctx := tagging.With(context.Background(), "app", "x")
	running, err := begin(e, ctx, "select 3")
	if err != nil {
		t.Fatal(err)
	}
	var b Batch
	queries := []string{"select 1", "select 2"}
	done := make(chan error, 1)
	go func() { done <- e.BeginBatchTaken(ctx, &b, nil, queries, nil) }()
	if err := answered(t, clk, done); !errors.Is(err, ErrWaitBeforeConn) {
		t.Fatalf("BeginBatchTaken held back for health: %v, want ErrWaitBeforeConn", err)
	}
	wantNothingHeld(t, e)
	for i := range b.Execs {
		if b.Execs[i].Decision == DecisionBlock {
			t.Errorf("statement %d marked blocked; it is decided again", i)
		}
	}

	go func() { done <- e.BeginBatchBeforeConn(ctx, &b, queries, nil) }()
	waiting(t, clk, done)
	running.Finish(ctx, nil)
	if err := <-done; err != nil {
		t.Fatalf("BeginBatchBeforeConn once healthy: %v", err)
	}
	if err := b.Acquired(ctx); err != nil {
		t.Fatal(err)
	}
	b.Finish(ctx, nil)
}

// TestAcquiredHeldBackForHealthWaitsBeforeConn: a statement admitted before its connection,
// overtaken while it waited for the pool, is held back by health once it has the connection:
// it gives it back (Acquired answers ErrWaitBeforeConn) and waits before it.
func TestAcquiredHeldBackForHealthWaitsBeforeConn(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1, max_wait: 10s, throttle_when: {in_flight: 2}}
rules:
  - {budget: a, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	pooled := new(Exec)
	pctx, err := e.BeginBeforeConn(ctx, pooled, "select 1", nil)
	if err != nil {
		t.Fatal(err)
	}
	running, err := begin(e, ctx, "select 2") // overtakes its pending slot
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- pooled.Acquired(pctx) }()
	err = answered(t, clk, done)
	if !errors.Is(err, ErrWaitBeforeConn) {
		t.Fatalf("Acquired held back for health: %v, want ErrWaitBeforeConn", err)
	}
	pooled.Abandon(pctx, err)
	wantNothingHeld(t, e)

	go func() {
		var err error
		pctx, err = e.BeginBeforeConn(ctx, pooled, "select 1", nil)
		done <- err
	}()
	waiting(t, clk, done) // for the running statement's slot, holding no connection
	running.Finish(ctx, nil)
	if err := <-done; err != nil {
		t.Fatalf("BeginBeforeConn once the slot is free: %v", err)
	}
	if err := pooled.Acquired(pctx); err != nil {
		t.Fatal(err)
	}
	pooled.Finish(pctx, nil)
}

// TestTakenWaitingForSlotThenHeldBackForHealth: a statement decided on a connection taken for
// it alone waits there for a slot (max_wait), as it may; when health turns bad while it waits,
// it does not go on waiting for health on that connection: it answers ErrWaitBeforeConn,
// holding nothing, and waits before its connection.
func TestTakenWaitingForSlotThenHeldBackForHealth(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1, max_wait: 10s, throttle_when: {in_flight: 2}}
rules:
  - {budget: a, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	running, err := begin(e, ctx, "select 2") // holds the slot; one in flight, healthy
	if err != nil {
		t.Fatal(err)
	}
	x := new(Exec)
	done := make(chan error, 1)
	go func() { _, err := e.BeginTaken(ctx, x, nil, "select 1", nil); done <- err }()
	waiting(t, clk, done) // for the slot, on its connection
	// Two statements of no budget start: with the slot's holder, three in flight.
	var others []*Exec
	for _, q := range []string{"select 3", "select 4"} {
		o, err := begin(e, context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, o)
	}
	running.Finish(ctx, nil) // the slot is free, but two in flight hold the budget back
	if err := answered(t, clk, done); !errors.Is(err, ErrWaitBeforeConn) {
		t.Fatalf("BeginTaken waiting for a slot, then held back for health: %v, want ErrWaitBeforeConn", err)
	}
	if n := e.InFlight(); n != 2 {
		t.Errorf("%d statements in flight, want the two others only", n)
	}
	if d := e.state.Load().budgets[0].b.Snapshot(e.now()).Decisions; d.Blocked != 0 {
		t.Errorf("%d refusals counted, want 0: the statement is decided again", d.Blocked)
	}

	// Decided again before its connection, it waits for health there, holding none.
	var pctx context.Context
	go func() {
		var err error
		pctx, err = e.BeginBeforeConn(ctx, x, "select 1", nil)
		done <- err
	}()
	waiting(t, clk, done)
	others[0].Finish(context.Background(), nil)
	if err := <-done; err != nil {
		t.Fatalf("BeginBeforeConn once healthy: %v", err)
	}
	if err := x.Acquired(pctx); err != nil {
		t.Fatal(err)
	}
	x.Finish(pctx, nil)
	others[1].Finish(context.Background(), nil)
}
