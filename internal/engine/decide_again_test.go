package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

func waitForWaiters(t *testing.T, e *Engine, n int) {
	t.Helper()
	for i := 0; i < 500; i++ {
		if _, w := inFlight(e); w == n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	_, w := inFlight(e)
	t.Fatalf("%d waiting, want %d", w, n)
}

// A pooled statement overtaken and waiting on its connection (Acquired) when a reload comes is
// decided again by the front end with the same Exec on that connection (BeginTaken): per
// the CHANGELOG it should rejoin in its place of arrival, ahead of a statement that arrived
// after it.
func TestDecideAgainKeepsArrival(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1, max_wait: 10s, max_queue: 6}
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
	waitForWaiters(t, e, 1)
	later := new(Exec)
	laterDone := make(chan error, 1)
	go func() { _, err := e.Begin(ctx, later, nil, "select 3", nil); laterDone <- err }()
	select {
	case err := <-laterDone:
		t.Fatalf("later ended: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	i, w := inFlight(e)
	t.Logf("inflight %d waiting %d", i, w)
	reload(t, e, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1, max_wait: 20s, max_queue: 6}
rules:
  - {budget: a, match: {app: x}}
`)
	if err := <-done; !errors.Is(err, ErrDecideAgain) {
		t.Fatalf("Acquired across a reload: %v, want ErrDecideAgain", err)
	}
	pooled.Abandon(pctx, err)
	againDone := make(chan error, 1)
	go func() { _, err := e.BeginTaken(ctx, pooled, nil, "select 1", nil); againDone <- err }()
	waitForWaiters(t, e, 2)
	held.Finish(ctx, nil)
	select {
	case err := <-againDone:
		if err != nil {
			t.Fatal(err)
		}
		pooled.Finish(ctx, nil)
		if err := <-laterDone; err != nil {
			t.Fatal(err)
		}
		later.Finish(ctx, nil)
	case err := <-laterDone:
		t.Errorf("the statement that arrived later was admitted first (%v): the pooled one decided again lost its place of arrival", err)
		later.Finish(ctx, nil)
		if err := <-againDone; err != nil {
			t.Fatal(err)
		}
		pooled.Finish(ctx, nil)
	case <-time.After(5 * time.Second):
		t.Fatal("nobody admitted")
	}
}
