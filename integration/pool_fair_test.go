package integration

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
)

// Waiters are admitted in arrival order; once max_queue wait, the next is refused at once with
// a RetryAfter.
func TestPoolFairnessAndQueueFull(t *testing.T) {
	p := pendingPool(t, 4, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 20s, max_queue: 3}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	rows, err := p.Query(ctx, "select generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := p.Exec(ctx, "select pg_sleep(0.05)"); err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
		}()
		pendingEventually(t, "waiter queued", func() bool { return poolBudget(t, p, "b").Waiting == i+1 })
	}
	start := time.Now()
	_, err = p.Exec(ctx, "select 99")
	var be *driver.BlockedError
	if !errors.As(err, &be) {
		t.Fatalf("queue full: %v", err)
	}
	if be.RetryAfter <= 0 {
		t.Errorf("queue full: RetryAfter %v", be.RetryAfter)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("queue full refused after %v", d)
	}
	if n := p.Stat().AcquiredConns(); n != 1 {
		t.Errorf("%d connections acquired with 3 waiting, want 1", n)
	}
	rows.Close()
	wg.Wait()
	if len(order) != 3 || order[0] != 0 || order[1] != 1 || order[2] != 2 {
		t.Errorf("admission order %v, want [0 1 2]", order)
	}
	poolHoldsNothing(t, p, "fairness")
}

// Reloading while statements wait: raising the limit admits them at once; closing the budget
// (max_concurrent: 0) refuses them at once.
func TestPoolReloadWhileQueued(t *testing.T) {
	rules := func(n string) *driver.Config {
		cfg, err := driver.ParseConfig([]byte(`budgets: [{name: b, mode: enforce, max_concurrent: ` + n + `, max_wait: 30s, max_queue: 8}]
rules: [{budget: b, match: {app: x}}]
`))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	p := pendingPool(t, 6, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 30s, max_queue: 8}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	rows, err := p.Query(ctx, "select generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 8)
	for range 4 {
		go func() { _, err := p.Exec(ctx, "select 1"); res <- err }()
	}
	pendingEventually(t, "4 wait", func() bool { return poolBudget(t, p, "b").Waiting == 4 })
	if err := p.SetConfig(rules("8")); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		select {
		case err := <-res:
			if err != nil {
				t.Errorf("after raising the limit: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("waiters not admitted after the limit was raised: %+v", poolBudget(t, p, "b"))
		}
	}
	if err := p.SetConfig(rules("1")); err != nil {
		t.Fatal(err)
	}
	// rows still hold a slot: new statements wait again.
	for range 3 {
		go func() { _, err := p.Exec(ctx, "select 2"); res <- err }()
	}
	pendingEventually(t, "3 wait", func() bool { return poolBudget(t, p, "b").Waiting == 3 })
	if err := p.SetConfig(rules("0")); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		select {
		case err := <-res:
			if !errors.Is(err, driver.ErrBlocked) {
				t.Errorf("after closing the budget: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("waiters not refused after the budget was closed: %+v", poolBudget(t, p, "b"))
		}
	}
	rows.Close()
	poolHoldsNothing(t, p, "reload")
}

// A small pool (2 connections) shared by transactions, pool statements, batches and a
// PoolConn, all under one budget of one slot with max_wait: nothing deadlocks (each call ends
// well within its 30 s context, refused at worst by max_wait or max_queue), and nothing leaks.
func TestPoolSmallPoolMixedNoDeadlock(t *testing.T) {
	p := pendingPool(t, 2, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 3s, max_queue: 32}]
rules: [{budget: b, match: {app: x}}]
`)
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	var stuck sync.Map
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range 8 {
				ctx, cancel := context.WithTimeout(pendingCtx, 30*time.Second)
				start := time.Now()
				var err error
				switch (g + it) % 4 {
				case 0:
					_, err = p.Exec(ctx, "select pg_sleep(0.01)")
				case 1:
					t2, e := p.Begin(ctx)
					if e != nil {
						err = e
						break
					}
					_, err = t2.Exec(ctx, "select pg_sleep(0.01)")
					if err == nil {
						var n int
						err = t2.QueryRow(ctx, "select 1").Scan(&n)
					}
					if err == nil {
						err = t2.Commit(ctx)
					} else {
						t2.Rollback(context.Background())
					}
				case 2:
					var n int
					err = p.QueryRow(ctx, "select 2").Scan(&n)
				case 3:
					err = p.AcquireFunc(ctx, func(c *driver.PoolConn) error {
						_, err := c.Exec(ctx, "select pg_sleep(0.01)")
						return err
					})
				}
				if time.Since(start) > 25*time.Second {
					stuck.Store(g*100+it, time.Since(start))
				}
				cancel()
				if err != nil && !errors.Is(err, driver.ErrBlocked) {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("unexpected error: %v", err)
	}
	stuck.Range(func(k, v any) bool { t.Errorf("call %v took %v", k, v); return true })
	poolHoldsNothing(t, p, "mixed")
}
