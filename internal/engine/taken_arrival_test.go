package engine

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestExplainedKeepsItsArrival: a statement of the pool whose cost needs an EXPLAIN waits
// before its connection in its place of arrival (precheck), holding none. Its decision on the
// connection then taken for the EXPLAIN (BeginTaken, after ErrNeedConn) is the same
// statement's: it waits there in that place, ahead of a statement that arrived after it, its
// max_wait counted from its arrival. (While it takes the connection and EXPLAINs it holds no
// place: a statement that needs no EXPLAIN may run first.)
func TestExplainedKeepsItsArrival(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1, server_share: 1, burst_limit: 100s, max_wait: 10s, max_queue: 4, throttle_when: {in_flight: 1000}}
rules:
  - {budget: a, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	first, err := begin(e, ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	cold := new(Exec)
	coldDone := make(chan error, 1)
	go func() { _, err := e.BeginBeforeConn(ctx, cold, "select 2", nil); coldDone <- err }()
	waiting(t, clk, coldDone)
	clk.Advance(6 * time.Second)

	// The slot goes: the cold statement leaves to EXPLAIN, and one arriving meanwhile runs.
	first.Finish(ctx, nil)
	if err := <-coldDone; err != ErrNeedConn {
		t.Fatalf("BeginBeforeConn once the slot went: %v, want ErrNeedConn", err)
	}
	second, err := begin(e, ctx, "select 3")
	if err != nil {
		t.Fatal(err)
	}
	third := new(Exec)
	thirdDone := make(chan error, 1)
	go func() { _, err := e.Begin(ctx, third, nil, "select 4", nil); thirdDone <- err }()
	waiting(t, clk, thirdDone)
	drainSet(clk)

	// Decided on its connection, it waits ahead of the third, for the rest of its max_wait.
	go func() { _, err := e.BeginTaken(ctx, cold, nil, "select 2", nil); coldDone <- err }()
	select {
	case tm := <-clk.Set():
		if tm.D != 4*time.Second {
			t.Errorf("it waits %v on its connection, want the 4s its max_wait has left since its arrival", tm.D)
		}
	case err := <-coldDone:
		t.Fatalf("BeginTaken did not wait: %v", err)
	case <-time.After(10 * time.Second): // a watchdog only
		t.Fatal("BeginTaken neither waited nor answered")
	}
	waitForWaiters(t, e, 2)
	second.Finish(ctx, nil)
	select {
	case err := <-coldDone:
		if err != nil {
			t.Fatal(err)
		}
		cold.Finish(ctx, nil)
		if err := <-thirdDone; err != nil {
			t.Fatal(err)
		}
		third.Finish(ctx, nil)
	case err := <-thirdDone:
		t.Errorf("the statement that arrived after it was admitted first (%v): it lost its place of arrival", err)
		third.Finish(ctx, nil)
		<-coldDone
		cold.Finish(ctx, nil)
	case <-time.After(10 * time.Second): // a watchdog only
		t.Fatal("nobody admitted")
	}
}

// drainSet forgets the timers clk announced so far.
func drainSet(clk *fakeclock.Clock) {
	for {
		select {
		case <-clk.Set():
		default:
			return
		}
	}
}

// TestExplainedWithoutConnIsForgotten: a statement that never got the connection for its
// EXPLAIN (its caller gave up, the pool closed) leaves nothing to the next statement of its
// Exec, which arrives anew: its max_wait counts from its own arrival.
func TestExplainedWithoutConnIsForgotten(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1, server_share: 1, burst_limit: 100s, max_wait: 10s, throttle_when: {in_flight: 1000}}
rules:
  - {budget: a, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	first, err := begin(e, ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	x := new(Exec)
	done := make(chan error, 1)
	go func() { _, err := e.BeginBeforeConn(ctx, x, "select 2", nil); done <- err }()
	waiting(t, clk, done)
	clk.Advance(6 * time.Second)
	first.Finish(ctx, nil)
	if err := <-done; err != ErrNeedConn {
		t.Fatalf("BeginBeforeConn once the slot went: %v, want ErrNeedConn", err)
	}
	// No connection came; the next statement arrives.
	if first, err = begin(e, ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	drainSet(clk)
	go func() { _, err := e.BeginBeforeConn(ctx, x, "select 2", nil); done <- err }()
	select {
	case tm := <-clk.Set():
		if tm.D != 10*time.Second {
			t.Errorf("the next statement waits %v, want its whole max_wait, 10s", tm.D)
		}
	case err := <-done:
		t.Fatalf("the next statement did not wait: %v", err)
	case <-time.After(10 * time.Second): // a watchdog only
		t.Fatal("the next statement neither waited nor answered")
	}
	first.Finish(ctx, nil)
	if err := <-done; err != ErrNeedConn {
		t.Fatalf("the next statement: %v, want ErrNeedConn", err)
	}
}

// TestBatchExplainedKeepsItsArrival: a batch decided on the connection taken for its EXPLAIN
// (BeginBatchTaken, after ErrNeedConn) is the same batch, as a statement is: its max_wait
// counts from its arrival.
func TestBatchExplainedKeepsItsArrival(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1, server_share: 1, burst_limit: 100s, max_wait: 10s, max_queue: 4, throttle_when: {in_flight: 1000}}
rules:
  - {budget: a, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	first, err := begin(e, ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	var b Batch
	queries := []string{"select 2", "select 3"}
	done := make(chan error, 1)
	go func() { done <- e.BeginBatchBeforeConn(ctx, &b, queries, nil) }()
	waiting(t, clk, done)
	clk.Advance(6 * time.Second)
	first.Finish(ctx, nil)
	if err := <-done; err != ErrNeedConn {
		t.Fatalf("BeginBatchBeforeConn once the slot went: %v, want ErrNeedConn", err)
	}
	if first, err = begin(e, ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	drainSet(clk)
	go func() { done <- e.BeginBatchTaken(ctx, &b, nil, queries, nil) }()
	select {
	case tm := <-clk.Set():
		if tm.D != 4*time.Second {
			t.Errorf("it waits %v on its connection, want the 4s its max_wait has left since its arrival", tm.D)
		}
	case err := <-done:
		t.Fatalf("BeginBatchTaken did not wait: %v", err)
	case <-time.After(10 * time.Second): // a watchdog only
		t.Fatal("BeginBatchTaken neither waited nor answered")
	}
	first.Finish(ctx, nil)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	b.Finish(ctx, nil)
}
