package integration

import (
	"context"
	"database/sql/driver"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	pgtdriver "github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// A batch selecting two budgets waits for the one that is full while holding nothing in the
// other (all or nothing); its context's deadline ends the wait with the context's error in
// every result, and leaves nothing behind.
func TestPoolBatchTwoBudgetsDeadline(t *testing.T) {
	p := pendingPool(t, 2, `budgets:
  - {name: a, mode: enforce, max_concurrent: 1, max_wait: 10s}
  - {name: b, mode: enforce, max_concurrent: 1, max_wait: 10s}
rules:
  - {budget: a, match: {a: "1"}}
  - {budget: b, match: {b: "1"}}
`)
	bg := context.Background()
	ra, err := p.Query(tagging.With(bg, "a", "1"), "select 1")
	if err != nil {
		t.Fatal(err)
	}
	defer ra.Close()
	ctx, cancel := context.WithTimeout(bg, 400*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		b := &pgx.Batch{}
		b.Queue("select 1 /* a */")
		b.Queue("select 2 /* b */")
		// Tags by context: both budgets.
		br := p.SendBatch(tagging.With(ctx, "a", "1", "b", "1"), b)
		_, err := br.Exec()
		br.Close()
		done <- err
	}()
	pendingEventually(t, "the batch waits", func() bool { return poolBudget(t, p, "a").Waiting == 1 })
	if b := poolBudget(t, p, "b"); b.InFlight != 0 {
		t.Errorf("the waiting batch holds b's slot: %+v", b)
	}
	start := time.Now()
	err = <-done
	t.Logf("batch answered %v after it was seen waiting: %v", time.Since(start), err)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("batch past its deadline: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("batch answered %v after its deadline's neighbourhood", d)
	}
	for _, name := range []string{"a", "b"} {
		b := poolBudget(t, p, name)
		if b.Waiting != 0 || (name == "b" && b.InFlight != 0) || (name == "a" && b.InFlight != 1) {
			t.Errorf("%s after the deadline: %+v", name, b)
		}
	}
	if n := p.Stat().AcquiredConns(); n != 1 {
		t.Errorf("%d connections acquired, want 1 (the open rows)", n)
	}
}

// database/sql: a statement waiting for capacity (holding its connection) whose context ends
// returns the context's error, not driver.ErrBadConn (which would make database/sql retry it),
// and its connection is usable afterwards.
func TestSQLWaitDeadline(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: b, mode: enforce, max_concurrent: 1, max_wait: 10s, max_queue: 4}
rules:
  - {budget: b, match: {app: x}}
`)
	db.SetMaxOpenConns(2)
	ctx := tagging.With(context.Background(), "app", "x")
	rows, err := db.QueryContext(ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = db.ExecContext(cctx, "select 2")
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, driver.ErrBadConn) {
		t.Errorf("waiting statement past its deadline: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("answered after %v", d)
	}
	if b := budgetStatus(t, c, "b"); b.Waiting != 0 || b.InFlight != 1 {
		t.Errorf("after the deadline: %+v", b)
	}
	rows.Close()
	// Both connections work: uncontrolled and controlled.
	for range 4 {
		if _, err := db.ExecContext(ctx, "select 3"); err != nil {
			t.Fatal(err)
		}
	}
	if s := db.Stats(); s.OpenConnections > 2 {
		t.Errorf("%d connections open", s.OpenConnections)
	}
}

// Pool.Wait beside pool statements waiting for the same budget: the statements come first.
// Wait returns only after the waiting statement was admitted, and never while the slot it
// would take is in use: not before the statement's 0.3 s on the server, which begins once the
// slot is free (rows.Close). (The statement's Exec may return a moment after Wait does: the slot
// goes back before Exec returns to its caller.)
func TestPoolWaitAfterQueuedStatements(t *testing.T) {
	p := pendingPool(t, 3, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 10s}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	rows, err := p.Query(ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	stmt := make(chan error, 1)
	go func() {
		_, err := p.Exec(ctx, "select pg_sleep(0.3)")
		stmt <- err
	}()
	pendingEventually(t, "the statement waits", func() bool { return poolBudget(t, p, "b").Waiting == 1 })
	waited := make(chan time.Time, 1) // when Wait returned
	ready := make(chan struct{})
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		close(ready)
		if err := p.Wait(wctx); err != nil {
			t.Errorf("Wait: %v", err)
		}
		waited <- time.Now()
	}()
	<-ready
	time.Sleep(100 * time.Millisecond)
	freed := time.Now() // the slot goes back
	rows.Close()
	if d := (<-waited).Sub(freed); d < 290*time.Millisecond {
		t.Errorf("Wait returned %v after the slot was freed, before the statement that waited first had its 0.3 s", d)
	}
	if err := <-stmt; err != nil {
		t.Fatal(err)
	}
}

// A pool statement admitted before its connection and waiting for the one a transaction holds
// when the Pool is closed: it is answered once the transaction ends (with an error: the pool is
// closed), gives back its slot, and Close does not hang.
func TestPoolCloseWhileWaitingForConn(t *testing.T) {
	p := pendingPool(t, 1, `budgets: [{name: b, mode: enforce, max_concurrent: 2, max_wait: 10s}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stmt := make(chan error, 1)
	go func() { _, err := p.Exec(ctx, "select 1"); stmt <- err }()
	pendingEventually(t, "admitted, pending", func() bool { return poolBudget(t, p, "b").InFlight == 1 })
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	time.Sleep(100 * time.Millisecond)
	tx.Rollback(context.Background())
	select {
	case err := <-stmt:
		t.Logf("the statement waiting for a connection at Close: %v", err)
		if err == nil {
			t.Error("ran on a closed pool")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the statement waiting for a connection was never answered")
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung")
	}
	if b := poolBudget(t, p, "b"); b.InFlight != 0 || b.Waiting != 0 {
		t.Errorf("after Close: %+v", b)
	}
	_ = pgtdriver.ErrClosed
}

// Two budgets, a pool of 2 connections held by a PoolConn and a transaction, pool statements
// waiting for capacity (a) and for a connection (b, pending), and the transaction's statement
// selecting both: it runs once a's running slot comes back (the pending slot of b waits for
// its very connection), and everything completes: no deadlock, nothing leaked.
func TestPoolTwoBudgetsHeldConnAndPending(t *testing.T) {
	p := pendingPool(t, 2, `budgets:
  - {name: a, mode: enforce, max_concurrent: 1, max_wait: 10s, max_queue: 8}
  - {name: b, mode: enforce, max_concurrent: 1, max_wait: 10s, max_queue: 8}
rules:
  - {budget: a, match: {a: "1"}}
  - {budget: b, match: {b: "1"}}
`)
	bg := context.Background()
	onlyA, onlyB := tagging.With(bg, "a", "1"), tagging.With(bg, "b", "1")
	ab := tagging.With(bg, "a", "1", "b", "1")
	c, err := p.Acquire(bg)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := p.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := c.Query(onlyA, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	type res struct {
		who string
		err error
	}
	done := make(chan res, 3)
	go func() { _, err := p.Exec(onlyA, "select 'p1'"); done <- res{"p1", err} }()
	pendingEventually(t, "p1 waits in a", func() bool { return poolBudget(t, p, "a").Waiting == 1 })
	go func() { _, err := p.Exec(onlyB, "select 'p2'"); done <- res{"p2", err} }()
	pendingEventually(t, "p2 pending in b", func() bool { return poolBudget(t, p, "b").InFlight == 1 })
	go func() { _, err := tx.Exec(ab, "select 's'"); done <- res{"s", err} }()
	time.Sleep(100 * time.Millisecond)
	rows.Close() // a's running slot comes back
	var first res
	select {
	case first = <-done:
	case <-time.After(8 * time.Second):
		t.Fatalf("nothing ran after a's slot came back: a %+v, b %+v", poolBudget(t, p, "a"), poolBudget(t, p, "b"))
	}
	if first.who != "s" || first.err != nil {
		t.Errorf("first to end: %s (%v), want the transaction's statement", first.who, first.err)
	}
	if first.who == "s" {
		tx.Commit(bg)
	} else {
		defer tx.Rollback(bg)
	}
	c.Release()
	for range 2 {
		select {
		case r := <-done:
			if r.err != nil {
				t.Errorf("%s: %v", r.who, r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("deadlock")
		}
	}
	for _, name := range []string{"a", "b"} {
		if b := poolBudget(t, p, name); b.InFlight != 0 || b.Waiting != 0 {
			t.Errorf("%s after: %+v", name, b)
		}
	}
}
