package engine

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestWaitTakesItsTurn: a batch job's Wait under a budget whose queue never empties (a slot held
// and statements always waiting for it) passes in its turn, in arrival order among the
// statements, rather than only once the queue is empty: a job that checks before each chunk
// must not be passed over for ever by statements that keep arriving. It takes nothing: the
// statement behind it is admitted next.
func TestWaitTakesItsTurn(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: q, mode: enforce, max_concurrent: 1, max_wait: 10s, max_queue: 6}
rules:
  - {budget: q, match: {app: q}}
`)
	ctx := tagging.With(context.Background(), "app", "q")
	b := e.state.Load().budgets[0].b
	queued := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); b.Waiting("") != n; { // a watchdog only
			if time.Now().After(deadline) {
				t.Fatalf("%d waiting, want %d", b.Waiting(""), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	type admitted struct {
		x   *Exec
		err error
	}
	statement := func() chan admitted {
		ch := make(chan admitted, 1)
		go func() {
			x, err := begin(e, ctx, "select 1")
			ch <- admitted{x, err}
		}()
		return ch
	}

	hold, err := begin(e, ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	before := statement() // waits first
	queued(1)
	waited := make(chan error, 1)
	go func() { waited <- e.Wait(ctx) }()
	queued(2)
	after := statement() // arrives behind the job
	queued(3)

	hold.Finish(ctx, nil) // the first waiter's turn
	first := <-before
	if first.err != nil {
		t.Fatalf("the statement that waited first: %v", first.err)
	}
	select {
	case err := <-waited:
		// The release made room for the statement ahead of the job: until it took it, it
		// was its own; now it holds it.
		t.Fatalf("Wait passed (%v) while the statement that waited ahead of it held the slot", err)
	default:
	}
	first.x.Finish(ctx, nil) // the job's turn, with the statement behind it still waiting
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("Wait in its turn: %v", err)
		}
	case <-time.After(10 * time.Second): // a watchdog only
		t.Fatal("Wait did not pass in its turn: it waits for the queue to empty, which steady traffic never lets happen")
	}
	last := <-after // took nothing: the statement behind the job is admitted next
	if last.err != nil {
		t.Fatalf("the statement behind the job: %v", last.err)
	}
	last.x.Finish(ctx, nil)
	if n := b.Waiting(""); n != 0 {
		t.Errorf("%d still waiting", n)
	}
}

// TestWaitWokenByReload: a job in Wait under a budget closed by a zero limit (an incident's
// block, whose refusal gives no retry hint: Wait backs off in health intervals) passes as soon
// as a reload reopens the budget, as the statements waiting under max_wait are decided again
// at once, not when its backoff next ends. The fake clock never moves: only the reload can
// wake it.
func TestWaitWokenByReload(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: q, mode: enforce, max_concurrent: 0}
rules:
  - {budget: q, match: {app: q}}
`)
	ctx := tagging.With(context.Background(), "app", "q")
	waited := make(chan error, 1)
	go func() { waited <- e.Wait(ctx) }()
	select {
	case <-clk.Set(): // Wait was refused and backs off
	case err := <-waited:
		t.Fatalf("Wait under a closed budget: %v, want it to wait", err)
	}
	reload(t, e, `
budgets:
  - {name: q, mode: enforce, max_concurrent: 1}
rules:
  - {budget: q, match: {app: q}}
`)
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("Wait after the budget reopened: %v", err)
		}
	case <-time.After(10 * time.Second): // a watchdog only: the fake clock never moved
		t.Fatal("Wait still waiting after a reload reopened its budget")
	}
}

// TestWaitEndedContext: Wait with a context that ended before the call answers the context's
// error, also when the budget has room (a job's loop `for { if err := Wait(ctx); err != nil
// { return err }; chunk(ctx) }` relies on it), as pgxpool's Acquire does; without rules too.
func TestWaitEndedContext(t *testing.T) {
	for name, rules := range map[string]string{"room": `
budgets:
  - {name: q, mode: enforce, max_concurrent: 1, max_wait: 10s}
rules:
  - {budget: q, match: {app: q}}
`, "no rules": ""} {
		t.Run(name, func(t *testing.T) {
			e, _ := newEngine(t, rules)
			ctx, cancel := context.WithCancel(tagging.With(context.Background(), "app", "q"))
			cancel()
			if err := e.Wait(ctx); err != context.Canceled {
				t.Errorf("Wait with an ended context: %v, want context.Canceled", err)
			}
		})
	}
}

// TestWaitWakesAtStatementEndUnderInFlight: a job in Wait held back by an in_flight threshold,
// under a budget without max_wait, passes when the statement in flight ends, as a statement
// waiting for health does, not at its next backoff (here an hour of a clock that does not move).
func TestWaitWakesAtStatementEndUnderInFlight(t *testing.T) {
	e, _ := newEngine(t, `
health_interval: 1h
budgets:
  - {name: a, mode: enforce, throttle_when: {in_flight: 1}}
rules:
  - {budget: a, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	running, err := begin(e, ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Check(ctx); err == nil {
		t.Fatal("Check passed with a statement in flight under in_flight: 1")
	}
	passed := make(chan error, 1)
	go func() { passed <- e.Wait(ctx) }()
	select {
	case err := <-passed:
		t.Fatalf("Wait returned %v with the statement still in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	running.Finish(ctx, nil)
	select {
	case err := <-passed:
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not pass when the statement in flight ended")
	}
}
