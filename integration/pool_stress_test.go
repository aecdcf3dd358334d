package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// Cancelled while waiting for a connection: pending slot back, pool usable.
func TestPoolFrontCancelWhileWaitingForConn(t *testing.T) {
	p := pendingPool(t, 1, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 5s, per: tenant}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := tagging.With(pendingCtx, "tenant", "a")
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"exec", "query", "queryrow", "batch", "copy"} {
		cctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
		switch kind {
		case "exec":
			_, err = p.Exec(cctx, "select 1")
		case "query":
			_, err = p.Query(cctx, "select 1")
		case "queryrow":
			var n int
			err = p.QueryRow(cctx, "select 1").Scan(&n)
		case "batch":
			b := &pgx.Batch{}
			b.Queue("select 1")
			err = p.SendBatch(cctx, b).Close()
		case "copy":
			_, err = p.CopyFrom(cctx, pgx.Identifier{"nope"}, []string{"a"}, pgx.CopyFromRows([][]any{{1}}))
		}
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: %T %v, want DeadlineExceeded", kind, err, err)
		}
		if b := poolBudget(t, p, "b"); b.InFlight != 0 || b.Waiting != 0 {
			t.Errorf("%s: after the cancelled wait for a connection: in flight %d waiting %d", kind, b.InFlight, b.Waiting)
		}
	}
	// The held connection's statements still run.
	if _, err := c.Exec(ctx, "select 1"); err != nil {
		t.Error(err)
	}
	c.Release()
	rvIdle(t, p, "b")
}

// max_queue defaults to max_concurrent per tenant.
func TestPoolFrontPerTenantQueue(t *testing.T) {
	p := pendingPool(t, 4, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 5s, per: tenant}]
rules: [{budget: b, match: {app: x}}]
`)
	ca := tagging.With(pendingCtx, "tenant", "a")
	cb := tagging.With(pendingCtx, "tenant", "b")
	rows, err := p.Query(ca, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := p.Exec(ca, "select 2"); done <- err }()
	pendingEventually(t, "a waits", func() bool { return poolBudget(t, p, "b").Waiting == 1 })
	start := time.Now()
	_, err = p.Exec(ca, "select 3")
	if be := asBlocked(t, err); be.Reason != driver.ReasonConcurrency || time.Since(start) > 2*time.Second {
		t.Errorf("second waiter of a: %+v after %v", be, time.Since(start))
	}
	if _, err := p.Exec(cb, "select 4"); err != nil {
		t.Errorf("tenant b below its limit: %v", err)
	}
	rows.Close()
	if err := <-done; err != nil {
		t.Errorf("a's waiter: %v", err)
	}
	rvIdle(t, p, "b")
}

// Cancelled mid-batch and mid-query: the context's error; the slot and connection back.
func TestPoolFrontCancelMidway(t *testing.T) {
	p := pendingPool(t, 1, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 1s}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx, cancel := context.WithCancel(pendingCtx)
	b := &pgx.Batch{}
	b.Queue("select 1")
	b.Queue("select pg_sleep(0.5)")
	b.Queue("select 3")
	br := p.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err := br.Exec()
	_ = err // pgx's own pipeline reads a batch's results without the context (as pgxpool)
	br.Close()
	rvIdle(t, p, "b")

	ctx, cancel = context.WithCancel(pendingCtx)
	rows, err := p.Query(ctx, "select pg_sleep(0.01), g from generate_series(1, 1000) g")
	if err != nil {
		t.Fatal(err)
	}
	rows.Next()
	cancel()
	for rows.Next() {
	}
	if !errors.Is(rows.Err(), context.Canceled) {
		t.Errorf("mid-query: %T %v", rows.Err(), rows.Err())
	}
	rows.Close()
	rvIdle(t, p, "b")

	ctx, cancel = context.WithCancel(pendingCtx)
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err = p.Exec(ctx, "select pg_sleep(5)")
	if !errors.Is(err, context.Canceled) {
		t.Errorf("mid-exec: %T %v", err, err)
	}
	rvIdle(t, p, "b")
	var n int
	if err := p.QueryRow(pendingCtx, "select 1").Scan(&n); err != nil {
		t.Error(err)
	}
}

// max_duration in a transaction and in a batch: ErrOverrun, PgError-less but cancels.
func TestPoolFrontOverrunInTx(t *testing.T) {
	p := pendingPool(t, 1, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_duration: 200ms}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, "select pg_sleep(3)")
	if !errors.Is(err, driver.ErrOverrun) {
		t.Errorf("tx overrun: %T %v", err, err)
	}
	tx.Rollback(context.Background())
	rvIdle(t, p, "b")
	b := &pgx.Batch{}
	var cbErr error
	b.Queue("select pg_sleep(3)").Exec(func(ct pgconn.CommandTag) error { return nil })
	err = p.SendBatch(ctx, b).Close()
	if !errors.Is(err, driver.ErrOverrun) {
		t.Errorf("batch overrun via callback: %T %v (%v)", err, err, cbErr)
	}
	rvIdle(t, p, "b")
}
