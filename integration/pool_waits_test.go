package integration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// reviewRefusal runs a pool statement that the budget refuses at once and returns its
// RetryAfter.
func reviewRefusal(t *testing.T, p *driver.Pool, ctx context.Context) time.Duration {
	t.Helper()
	_, err := p.Exec(ctx, "select 42")
	var be *driver.BlockedError
	if !errors.As(err, &be) || be.Reason != driver.ReasonConcurrency {
		t.Fatalf("want a concurrency refusal, got %v", err)
	}
	return be.RetryAfter
}

// README: a refused statement is retried after its RetryAfter; for a slot it is a hint of the
// mean hold time (budget.concurrencyHint). Pool statements that were admitted before their
// connection and never got one (their context ended while the pool was busy) never ran: they
// held no slot on the server and should teach no hold time, as budget.connect says of an
// overtaken one ("never admitted: no hold time to learn"). Here 30 such statements make the
// hint of a budget whose statements run 300 ms collapse.
func TestPoolRetryAfterAfterAbandonedWaits(t *testing.T) {
	p := pendingPool(t, 1, `budgets: [{name: b, mode: enforce, max_concurrent: 1}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	// The hold time learned: a few statements of 300 ms.
	for range 2 {
		if _, err := p.Exec(ctx, "select pg_sleep(0.3)"); err != nil {
			t.Fatal(err)
		}
	}
	hold := func() (wait func()) {
		done := make(chan error, 1)
		go func() { _, err := p.Exec(ctx, "select pg_sleep(0.3)"); done <- err }()
		pendingEventually(t, "the slot is taken", func() bool {
			return poolBudget(t, p, "b").InFlight == 1 && p.Stat().AcquiredConns() == 1
		})
		return func() {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	}
	wait := hold()
	before := reviewRefusal(t, p, ctx)
	wait()

	// The pool's only connection is held; 30 statements are admitted (pending) and give up
	// waiting for it.
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 30 {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		_, err := p.Exec(cctx, "select 1")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a statement waiting for the held connection: %v", err)
		}
	}
	c.Release()

	wait = hold()
	after := reviewRefusal(t, p, ctx)
	wait()
	t.Logf("RetryAfter before %v, after 30 statements that never got a connection %v", before, after)
	if after < before/3 {
		t.Errorf("RetryAfter fell from %v to %v: statements that never ran (abandoned while waiting for a "+
			"connection) were learned as 0 s holds", before, after)
	}
}

// A statement whose cost needs an EXPLAIN (explain: call) takes its connection first and, when
// it must wait, waits holding it. Its context's deadline ends the wait (a context error, well
// before max_wait), gives the connection back and leaves no slot or waiter behind.
func TestPoolExplainWaitDeadline(t *testing.T) {
	p := pendingPool(t, 3, `budgets: [{name: b, mode: enforce, max_concurrent: 1, server_share: 1, burst_limit: 100s, explain: call, max_wait: 10s, max_queue: 4}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	rows, err := p.Query(ctx, "select generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = p.Exec(cctx, "select 1")
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("waiting statement past its deadline: %v", err)
	}
	if took > 5*time.Second {
		t.Errorf("waited %v, past its context's deadline", took)
	}
	if n := p.Stat().AcquiredConns(); n != 1 {
		t.Errorf("%d connections acquired after the wait ended, want 1 (the open rows)", n)
	}
	if b := poolBudget(t, p, "b"); b.Waiting != 0 || b.InFlight != 1 {
		t.Errorf("after the wait: %+v", b)
	}
	rows.Close()
	pendingEventually(t, "nothing left", func() bool {
		b := poolBudget(t, p, "b")
		return b.InFlight == 0 && b.Waiting == 0 && p.Stat().AcquiredConns() == 0
	})
}

// max_queue full on the EXPLAIN path: a statement whose cost needs an EXPLAIN on a connection
// waits for room before it takes one, holding none, and one that finds the queue full is
// refused at once with a RetryAfter (non-zero: waiting helps), before it takes one either, so
// that uncontrolled work still finds the pool's connections.
func TestPoolExplainQueueFull(t *testing.T) {
	p := pendingPool(t, 3, `budgets: [{name: b, mode: enforce, max_concurrent: 1, server_share: 1, burst_limit: 100s, explain: call, max_wait: 10s, max_queue: 1}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	rows, err := p.Query(ctx, "select generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	waiter := make(chan error, 1)
	go func() { _, err := p.Exec(ctx, "select 1"); waiter <- err }()
	pendingEventually(t, "one waits", func() bool { return poolBudget(t, p, "b").Waiting == 1 })
	start := time.Now()
	_, err = p.Exec(ctx, "select 2")
	var be *driver.BlockedError
	if !errors.As(err, &be) || !errors.Is(err, driver.ErrBlocked) {
		t.Fatalf("a statement finding the queue full: %v", err)
	}
	if be.RetryAfter <= 0 {
		t.Errorf("queue full: RetryAfter %v, want > 0 (waiting can help)", be.RetryAfter)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("refused after %v, want at once", d)
	}
	if n := p.Stat().AcquiredConns(); n != 1 {
		t.Errorf("%d connections acquired, want 1 (the rows': the waiter and the refused statement hold none)", n)
	}
	// Uncontrolled work gets a connection.
	if _, err := p.Exec(context.Background(), "select 3"); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if err := <-waiter; err != nil {
		t.Fatal(err)
	}
	pendingEventually(t, "nothing left", func() bool {
		b := poolBudget(t, p, "b")
		return b.InFlight == 0 && b.Waiting == 0 && p.Stat().AcquiredConns() == 0
	})
}

// Pool.Close while statements wait for capacity: on the EXPLAIN path (holding a connection), on
// a PoolConn, and decided before their connection (holding none). Each returns ErrClosed at
// once; Close itself returns once the rows holding the slot are closed.
func TestPoolCloseWhileWaitingEveryPath(t *testing.T) {
	p := pendingPool(t, 4, `budgets:
  - {name: b, mode: enforce, max_concurrent: 1, max_wait: 20s, max_queue: 8}
  - {name: e, mode: enforce, max_concurrent: 1, server_share: 1, burst_limit: 100s, explain: call, max_wait: 20s, max_queue: 8}
rules:
  - {budget: b, match: {app: x}}
  - {budget: e, match: {app: e}}
`)
	ctx := pendingCtx
	ectx := tagging.With(context.Background(), "app", "e")
	rows, err := p.Query(ctx, "select generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	erows, err := p.Query(ectx, "select generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type res struct {
		who string
		err error
	}
	errs := make(chan res, 3)
	go func() { _, err := p.Exec(ctx, "select 1"); errs <- res{"pool", err} }()
	go func() { _, err := c.Exec(ctx, "select 2"); errs <- res{"poolconn", err} }()
	pendingEventually(t, "two wait in b", func() bool { return poolBudget(t, p, "b").Waiting == 2 })
	go func() { _, err := p.Exec(ectx, "select 3"); errs <- res{"explained", err} }()
	pendingEventually(t, "one waits in e", func() bool { return poolBudget(t, p, "e").Waiting == 1 })

	closed := make(chan struct{})
	start := time.Now()
	go func() { p.Close(); close(closed) }()
	for range 3 {
		select {
		case r := <-errs:
			if !errors.Is(r.err, driver.ErrClosed) {
				t.Errorf("%s: %v, want ErrClosed", r.who, r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("a waiting statement was not answered within 10 s of Close")
		}
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("answered after %v, want at once", d)
	}
	rows.Close()
	erows.Close()
	c.Release()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return once every connection was released")
	}
	if err := p.Wait(ctx); !errors.Is(err, driver.ErrClosed) {
		t.Errorf("Wait after Close: %v", err)
	}
}

// Statements selecting two budgets: all or nothing in arrival order, no deadlock. Two rows hold
// the slots of a and b; w1 (a and b), w2 (b) and w3 (a) queue in that order. b's slot comes
// back first: w2 must not pass w1 (first in b's queue, still waiting for a). Then a's: w1 runs,
// then w2 and w3. On the pool and on a transaction's held connections alike.
func TestPoolTwoBudgetsArrivalOrder(t *testing.T) {
	p := pendingPool(t, 8, `budgets:
  - {name: a, mode: enforce, max_concurrent: 1, max_wait: 20s, max_queue: 8}
  - {name: b, mode: enforce, max_concurrent: 1, max_wait: 20s, max_queue: 8}
rules:
  - {budget: a, match: {a: "1"}}
  - {budget: b, match: {b: "1"}}
`)
	bg := context.Background()
	if _, err := p.Exec(bg, "create table arrivals2 (seq serial primary key, who text)"); err != nil {
		t.Fatal(err)
	}
	ab := tagging.With(bg, "a", "1", "b", "1")
	onlyA := tagging.With(bg, "a", "1")
	onlyB := tagging.With(bg, "b", "1")
	ra, err := p.Query(onlyA, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	rb, err := p.Query(onlyB, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 3)
	ins := func(ctx context.Context, who string) {
		_, err := p.Exec(ctx, "insert into arrivals2 (who) values ($1)", who)
		errs <- err
	}
	go ins(ab, "w1")
	pendingEventually(t, "w1 waits", func() bool { return poolBudget(t, p, "a").Waiting == 1 })
	go ins(onlyB, "w2")
	pendingEventually(t, "w2 waits", func() bool { return poolBudget(t, p, "b").Waiting == 2 })
	go ins(onlyA, "w3")
	pendingEventually(t, "w3 waits", func() bool { return poolBudget(t, p, "a").Waiting == 2 })
	rb.Close()
	time.Sleep(200 * time.Millisecond)
	var n int
	if err := p.QueryRow(bg, "select count(*) from arrivals2").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d statements ran while w1, first in b's queue, still waited for a", n)
	}
	ra.Close()
	for range 3 {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("deadlock: the waiters did not all run")
		}
	}
	rows, _ := p.Query(bg, "select who from arrivals2 order by seq")
	order, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(order) != 3 || order[0] != "w1" {
		t.Errorf("order %v, want w1 first", order)
	}
	for _, name := range []string{"a", "b"} {
		if b := poolBudget(t, p, name); b.InFlight != 0 || b.Waiting != 0 {
			t.Errorf("%s after: %+v", name, b)
		}
	}
}

// A pool of 2 connections shared between a controlled budget whose statements must all be
// costed on their connection (explain: call: each takes its connection first and waits holding
// it, at most max_queue = 1) and uncontrolled work: the controlled work holds at most
// max_concurrent + max_queue = 2 connections, plus moments for refusals. The uncontrolled work
// still gets a connection within a bounded time; it is not starved.
func TestPoolExplainSmallPoolUncontrolledProgress(t *testing.T) {
	p := pendingPool(t, 3, `budgets: [{name: b, mode: enforce, max_concurrent: 1, server_share: 1, burst_limit: 100s, explain: call, max_wait: 2s, max_queue: 1}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx, stop := context.WithCancel(pendingCtx)
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			for ctx.Err() == nil {
				_, err := p.Exec(ctx, fmt.Sprintf("select pg_sleep(0.05), %d", i))
				var be *driver.BlockedError
				if errors.As(err, &be) {
					time.Sleep(max(be.RetryAfter, time.Millisecond))
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	var worst time.Duration
	for range 50 {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		_, err := p.Exec(cctx, "select 1")
		cancel()
		if err != nil {
			t.Errorf("uncontrolled statement: %v", err)
			break
		}
		worst = max(worst, time.Since(start))
	}
	stop()
	wg.Wait()
	t.Logf("the uncontrolled statements' longest wait: %v", worst)
	if worst > 1500*time.Millisecond {
		t.Errorf("an uncontrolled statement waited %v for a connection of a pool of 3 "+
			"(the budget's statements should hold at most 2)", worst)
	}
	pendingEventually(t, "nothing left", func() bool {
		b := poolBudget(t, p, "b")
		return b.InFlight == 0 && b.Waiting == 0 && p.Stat().AcquiredConns() == 0
	})
}
