package driver_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// The pgx-native pool decides a statement before it takes a connection, and the admitted
// statement keeps its slot while it waits for one; a statement that already holds a connection
// (a transaction's, a PoolConn's, one that had to EXPLAIN first) is decided on it. These tests
// put the two orders against each other on a pool too small for both, where a statement on a
// held connection must never be held up by the slot of one still waiting for a connection.

// inversionPool opens a pool of maxConns connections on a new database under rules, and
// returns it with the database's DSN.
func inversionPool(t *testing.T, maxConns int32, rules string) (*driver.Pool, string) {
	t.Helper()
	dsn := pgtest.Shared(t).CreateDatabase(t)
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = maxConns
	cfg, err := driver.ParseConfig([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	p, err := driver.NewPoolFromConfig(context.Background(), pc, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, dsn
}

// inversionBudget is the status of p's budget b.
func inversionBudget(t *testing.T, p *driver.Pool) driver.BudgetStatus {
	t.Helper()
	for _, b := range p.Snapshot().Budgets {
		if b.Name == "b" {
			return b
		}
	}
	t.Fatal("no budget b")
	return driver.BudgetStatus{}
}

// eventually polls cond until it holds, and fails the test when it does not within a
// generous bound (a watchdog: the machine may be slow).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// noneLeft fails the test when p's budget still holds or queues anything, or a connection is
// still acquired.
func noneLeft(t *testing.T, p *driver.Pool) {
	t.Helper()
	eventually(t, "the budget and the pool are idle", func() bool {
		b := inversionBudget(t, p)
		return b.InFlight == 0 && b.Waiting == 0 && p.Snapshot().InFlight == 0 && p.Stat().AcquiredConns() == 0
	})
}

var inversionCtx = tagging.With(context.Background(), "app", "x")

// A transaction holds the pool's only connection; a pool statement is admitted into the
// budget's only slot and waits for the connection. The transaction's next statement runs (it
// holds a connection, the pool statement does not yet), and the pool statement runs once the
// transaction ends. With or without max_wait.
func TestPoolTxNotHeldByStatementWaitingForConn(t *testing.T) {
	for _, tc := range []struct{ name, maxWait string }{{"no max_wait", ""}, {"max_wait", ", max_wait: 5s"}} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := inversionPool(t, 1, `budgets: [{name: b, mode: enforce, max_concurrent: 1`+tc.maxWait+`}]
rules: [{budget: b, match: {app: x}}]
`)
			tx, err := p.Begin(inversionCtx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background())
			if _, err := tx.Exec(inversionCtx, "select 1"); err != nil {
				t.Fatal(err)
			}
			other := make(chan error, 1)
			go func() {
				_, err := p.Exec(inversionCtx, "select 2")
				other <- err
			}()
			eventually(t, "the pool statement is admitted", func() bool { return inversionBudget(t, p).InFlight == 1 })
			if _, err := tx.Exec(inversionCtx, "select 3"); err != nil {
				t.Errorf("the transaction's statement, on the connection it holds, was held up by the slot of a pool "+
					"statement waiting for that connection: %v", err)
			}
			select {
			case err := <-other:
				t.Fatalf("the pool statement ended while the transaction held the only connection: %v", err)
			default:
			}
			if err := tx.Commit(inversionCtx); err != nil {
				t.Fatal(err)
			}
			if err := <-other; err != nil {
				t.Errorf("the pool statement, once the transaction gave the connection back: %v", err)
			}
			noneLeft(t, p)
		})
	}
}

// One pool statement of a pattern not yet costed (a budget with per_query_limit) takes the
// pool's only connection first and EXPLAINs there, held up by a lock; a statement of a known
// pattern arriving meanwhile is admitted into the budget's only slot and waits for the
// connection. The first, decided on its connection once its EXPLAIN returns, overtakes the
// waiting slot; then the second runs.
func TestPoolExplainedNotHeldByStatementWaitingForConn(t *testing.T) {
	p, dsn := inversionPool(t, 1, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 5s, per_query_limit: 100s}]
rules: [{budget: b, match: {app: x}}]
`)
	if _, err := p.Raw().Exec(context.Background(), "create table locked (id int)"); err != nil {
		t.Fatal(err)
	}
	for range 3 { // teach the known pattern its cost
		if _, err := p.Exec(inversionCtx, "select 2"); err != nil {
			t.Fatal(err)
		}
	}
	locker, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	if _, err := locker.Exec(context.Background(), "begin; lock table locked in access exclusive mode"); err != nil {
		t.Fatal(err)
	}
	newDone := make(chan error, 1)
	go func() {
		_, err := p.Exec(inversionCtx, "select count(*) from locked")
		newDone <- err
	}()
	eventually(t, "the new pattern's EXPLAIN waits for the lock", func() bool {
		var n int
		err := locker.QueryRow(context.Background(), "select count(*) from pg_locks where not granted").Scan(&n)
		return err == nil && n > 0
	})
	knownDone := make(chan error, 1)
	go func() {
		_, err := p.Exec(inversionCtx, "select 2")
		knownDone <- err
	}()
	eventually(t, "the known pattern is admitted", func() bool { return inversionBudget(t, p).InFlight == 1 })
	if _, err := locker.Exec(context.Background(), "commit"); err != nil {
		t.Fatal(err)
	}
	if err := <-newDone; err != nil {
		t.Errorf("the statement that EXPLAINed on its connection was held up by the slot of one waiting for "+
			"that connection: %v", err)
	}
	if err := <-knownDone; err != nil {
		t.Errorf("the known pattern, once the connection was free: %v", err)
	}
	noneLeft(t, p)
}

// A pool statement admitted before its connection, overtaken meanwhile by a statement of a
// transaction that runs in the budget's only slot, is decided again once it has its
// connection: it waits (max_wait) for the transaction's statement to end, and runs after it,
// never beside it.
func TestPoolOvertakenStatementDecidedAgain(t *testing.T) {
	p, _ := inversionPool(t, 2, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 5s}]
rules: [{budget: b, match: {app: x}}]
`)
	slow, err := p.Begin(inversionCtx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(context.Background())
	idle, err := p.Begin(inversionCtx)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Rollback(context.Background())
	type done struct {
		err error
		at  time.Time
	}
	pooled := make(chan done, 1)
	go func() {
		_, err := p.Exec(inversionCtx, "select 2")
		pooled <- done{err, time.Now()}
	}()
	eventually(t, "the pool statement is admitted", func() bool { return inversionBudget(t, p).InFlight == 1 })
	slowDone := make(chan done, 1)
	launched := time.Now() // the transaction's statement ends half a second after this, or later
	go func() {
		_, err := slow.Exec(inversionCtx, "select pg_sleep(0.5)")
		slowDone <- done{err, time.Now()}
	}()
	eventually(t, "the transaction's statement overtakes", func() bool { return inversionBudget(t, p).InFlight == 2 })
	// The pool statement gets a connection while the transaction's statement runs.
	if err := idle.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := <-slowDone
	if s.err != nil {
		t.Fatalf("the transaction's statement: %v", s.err)
	}
	o := <-pooled
	if o.err != nil {
		t.Fatalf("the overtaken pool statement: %v", o.err)
	}
	// A lower bound that a slow machine cannot break: the pool statement could only have ended
	// this soon by running beside the transaction's statement.
	if took := o.at.Sub(launched); took < 500*time.Millisecond {
		t.Errorf("the overtaken pool statement ended %v after the transaction's statement of 500ms began: "+
			"two statements ran in a budget of one slot", took)
	}
	if err := slow.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	noneLeft(t, p)
}
