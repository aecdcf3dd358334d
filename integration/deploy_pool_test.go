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

// TestDeployPoolColdStartSmallPool: a deploy on the pgx-native pool with 2 connections:
// 16 requests at once each run 6 patterns the process has never seen, under an enforce budget
// with slots, a bucket that their real costs never fill and a long max_wait. Every statement
// of a new pattern must EXPLAIN on its connection first; the README promises that statements
// on held connections and pending ones cannot wait for each other: nothing deadlocks, nothing
// is refused, every slot comes back.
func TestDeployPoolColdStartSmallPool(t *testing.T) {
	const requests, patterns = 16, 6
	p := pendingPool(t, 2, `
server_cores: 16
budgets:
  - {name: all, mode: enforce, max_concurrent: 2, server_share: 1, burst_limit: 20s, max_wait: 15s, max_queue: 32}
rules:
  - {budget: all, match: {app: x}}
`)
	ctx, cancel := context.WithTimeout(pendingCtx, 30*time.Second)
	defer cancel()
	for j := range patterns {
		if _, err := p.Raw().Exec(ctx, fmt.Sprintf("create table pc_%d (id int primary key)", j)); err != nil {
			t.Fatal(err)
		}
	}
	errs := make(chan error, requests*patterns)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for r := range requests {
		wg.Go(func() {
			<-start
			for j := range patterns {
				q := fmt.Sprintf("select pg_sleep(0.005), count(*) from pc_%d where id <> $1", j)
				if r%3 == 0 { // some in transactions: statements on held connections
					tx, err := p.Begin(ctx)
					if err == nil {
						_, err = tx.Exec(ctx, q, r)
						if err == nil {
							err = tx.Commit(ctx)
						} else {
							tx.Rollback(ctx)
						}
					}
					if err != nil {
						errs <- fmt.Errorf("request %d (tx), pattern %d: %w", r, j, err)
					}
					continue
				}
				if _, err := p.Exec(ctx, q, r); err != nil {
					errs <- fmt.Errorf("request %d, pattern %d: %w", r, j, err)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if b := poolBudget(t, p, "all"); b.InFlight != 0 || b.Waiting != 0 {
		t.Errorf("after the cold start: %+v", b)
	}
}

// TestDeployPoolReloadNeedsCost: pool statements wait (holding no connection) for the
// slot open rows hold, on a pattern never costed, under a budget with only slots. A reload adds
// a per_query_limit (so their pattern now needs an EXPLAIN on a connection). They are decided
// again under it: none hangs, none is refused, and every slot comes back.
func TestDeployPoolReloadNeedsCost(t *testing.T) {
	before := "budgets:\n  - {name: b, mode: enforce, max_concurrent: 1, max_wait: 10s, max_queue: 4}\nrules:\n  - {budget: b, match: {app: x}}\n"
	after := "budgets:\n  - {name: b, mode: enforce, max_concurrent: 1, max_wait: 10s, max_queue: 4, per_query_limit: 30s}\nrules:\n  - {budget: b, match: {app: x}}\n"
	p := pendingPool(t, 4, before)
	ctx := pendingCtx
	rows, err := p.Query(ctx, "select g from generate_series(1, 100000) g")
	if err != nil {
		t.Fatal(err)
	}
	rows.Next()
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := p.Exec(ctx, "select pg_sleep(0.02)")
			errs <- err
		}()
	}
	pendingEventually(t, "three wait", func() bool { return poolBudget(t, p, "b").Waiting == 3 })
	cfg, err := driver.ParseConfig([]byte(after))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	rows.Close()
	for range 3 {
		select {
		case err := <-errs:
			if err != nil {
				t.Errorf("waiter: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a waiter hangs")
		}
	}
	if b := poolBudget(t, p, "b"); b.InFlight != 0 || b.Waiting != 0 {
		t.Errorf("after: %+v", b)
	}
}

// TestDeployPoolReloadClosesWaiters: pool statements waiting for the slot are refused at
// once by a reload that closes the budget, holding no connection, and the budget comes back
// idle.
func TestDeployPoolReloadClosesWaiters(t *testing.T) {
	before := "budgets:\n  - {name: b, mode: enforce, max_concurrent: 1, max_wait: 10s, max_queue: 4}\nrules:\n  - {budget: b, match: {app: x}}\n"
	closed := "budgets:\n  - {name: b, mode: enforce, max_concurrent: 0}\nrules:\n  - {budget: b, match: {app: x}}\n"
	p := pendingPool(t, 4, before)
	ctx := pendingCtx
	rows, err := p.Query(ctx, "select g from generate_series(1, 100000) g")
	if err != nil {
		t.Fatal(err)
	}
	rows.Next()
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := p.Exec(tagging.With(context.Background(), "app", "x"), "select 1")
			errs <- err
		}()
	}
	pendingEventually(t, "three wait", func() bool { return poolBudget(t, p, "b").Waiting == 3 })
	cfg, _ := driver.ParseConfig([]byte(closed))
	if err := p.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		select {
		case err := <-errs:
			var be *driver.BlockedError
			if !errors.As(err, &be) || be.Reason != driver.ReasonConcurrency {
				t.Errorf("waiter: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a waiter hangs")
		}
	}
	if s := p.Stat(); s.AcquiredConns() != 1 {
		t.Errorf("acquired conns %d; want only the open rows'", s.AcquiredConns())
	}
	rows.Close()
	cfg, _ = driver.ParseConfig([]byte(before))
	p.SetConfig(cfg)
	if b := poolBudget(t, p, "b"); b.InFlight != 0 || b.Waiting != 0 {
		t.Errorf("after: %+v", b)
	}
	_ = pgx.ErrNoRows
}
