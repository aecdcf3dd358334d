package driver_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// TestPoolCheckCountsStatementsWaitingForConn: a pool statement admitted into a budget's only
// slot holds it while it waits for a connection (the pool's only one is a transaction's). A
// batch job's Check and Wait must see that slot taken, as the job's own next pool statement
// does: Check said "admitted" while the statement it stood for was refused.
func TestPoolCheckCountsStatementsWaitingForConn(t *testing.T) {
	p, _ := inversionPool(t, 1, `budgets: [{name: b, mode: enforce, max_concurrent: 1}]
rules: [{budget: b, match: {app: x}}]
`)
	bg := context.Background()
	tx, err := p.Begin(bg) // no budget: it only takes the pool's only connection
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(bg, "select 1"); err != nil {
		t.Fatal(err)
	}
	other := make(chan error, 1)
	go func() {
		_, err := p.Exec(inversionCtx, "select 2")
		other <- err
	}()
	eventually(t, "the pool statement is admitted", func() bool { return inversionBudget(t, p).InFlight == 1 })

	_, execErr := p.Exec(inversionCtx, "select 3")
	if !errors.Is(execErr, driver.ErrBlocked) {
		t.Fatalf("a second pool statement while the only slot is held: %v, want refused", execErr)
	}
	if err := p.Check(inversionCtx); !errors.Is(err, driver.ErrBlocked) {
		t.Errorf("Check while the budget's only slot is held by a statement waiting for a connection: %v, "+
			"want refused as the statement itself was (%v)", err, execErr)
	}
	ctx, cancel := context.WithCancel(inversionCtx)
	cancel()
	if err := p.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait with a cancelled context while the slot is held: %v, want context.Canceled", err)
	}
	if err := tx.Commit(bg); err != nil {
		t.Fatal(err)
	}
	if err := <-other; err != nil {
		t.Fatal(err)
	}
	noneLeft(t, p)
	if err := p.Check(inversionCtx); err != nil {
		t.Errorf("Check once the slot is free: %v", err)
	}
}

// TestWaitReturnsErrClosed: a batch job in Wait, refused for as long as the budget is closed
// (max_concurrent: 0), gets ErrClosed at once when its Connector (*sql.DB) or Pool is closed,
// as a statement waiting for capacity does, rather than waiting on until its context ends
// (for ever under context.Background, a shutdown that hangs).
func TestWaitReturnsErrClosed(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	cfg := &driver.Config{
		Budgets: []driver.Budget{{Name: "b", Mode: driver.ModeEnforce, MaxConcurrent: new(0)}},
		Rules:   []driver.Rule{{Budget: "b", Match: map[string]string{"app": "x"}}},
	}
	fronts := map[string]func(t *testing.T) (wait func(context.Context) error, closeIt func()){
		"database/sql": func(t *testing.T) (func(context.Context) error, func()) {
			c, err := driver.NewConnector(dsn, driver.WithConfig(cfg))
			if err != nil {
				t.Fatal(err)
			}
			db := sql.OpenDB(c)
			t.Cleanup(func() { db.Close() })
			return c.Wait, func() { db.Close() }
		},
		"pool": func(t *testing.T) (func(context.Context) error, func()) {
			p, err := driver.NewPool(context.Background(), dsn, driver.WithConfig(cfg))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			return p.Wait, p.Close
		},
	}
	for name, open := range fronts {
		t.Run(name, func(t *testing.T) {
			wait, closeIt := open(t)
			ctx, cancel := context.WithTimeout(inversionCtx, 20*time.Second) // a watchdog
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- wait(ctx) }()
			time.Sleep(100 * time.Millisecond) // in Wait's backoff
			closeIt()
			select {
			case err := <-done:
				if !errors.Is(err, driver.ErrClosed) {
					t.Errorf("Wait when closed: %v, want ErrClosed", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Wait still waiting 5s after its front end was closed")
			}
			if err := wait(ctx); !errors.Is(err, driver.ErrClosed) {
				t.Errorf("Wait after close: %v, want ErrClosed", err)
			}
		})
	}
}
