package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// pendingPool opens a pool of maxConns connections on a new database under rules.
func pendingPool(t *testing.T, maxConns int32, rules string, opts ...driver.Option) *driver.Pool {
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
	p, err := driver.NewPoolFromConfig(context.Background(), pc, append([]driver.Option{driver.WithConfig(cfg)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func pendingEventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var pendingCtx = tagging.With(context.Background(), "app", "x")

// A transaction's statement that queued behind two pool statements (while the budget's slot
// was a running one) runs as soon as the first of them is admitted into a pending slot: it
// holds the connection that pending statement waits for, and a statement on a held connection
// is never held up by the slots of pool statements waiting for a connection.
func TestPoolPendingWakesConnectedWaiter(t *testing.T) {
	p := pendingPool(t, 2, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 5s, max_queue: 4}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	tx, err := p.Begin(ctx) // connection A
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	c, err := p.Acquire(ctx) // connection B: the pool has none left
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	// C's query holds the budget's only slot (a running one) while its rows are open.
	rows, err := c.Query(ctx, "select generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		who string
		err error
	}
	done := make(chan result, 3)
	go func() {
		_, err := p.Exec(ctx, "select 1")
		done <- result{"p1", err}
	}()
	pendingEventually(t, "p1 waits", func() bool { return poolBudget(t, p, "b").Waiting == 1 })
	go func() {
		_, err := p.Exec(ctx, "select 2")
		done <- result{"p2", err}
	}()
	pendingEventually(t, "p2 waits", func() bool { return poolBudget(t, p, "b").Waiting == 2 })
	go func() {
		_, err := tx.Exec(ctx, "select 3")
		done <- result{"tx", err}
	}()
	pendingEventually(t, "the transaction's statement waits", func() bool { return poolBudget(t, p, "b").Waiting == 3 })
	// C's slot comes back: p1 is admitted into a pending slot and waits for a connection (none
	// is free: the transaction holds A, C holds B). The transaction's statement, on its held
	// connection, should now pass the queue (running slots: 0 of 1).
	rows.Close()
	// The transaction's statement and p2 end in either order (p1 needs a connection, which comes
	// only once the transaction ends): collect both before failing, so that the transaction is
	// not used by two goroutines.
	first, second := <-done, <-done
	if err := tx.Commit(ctx); err != nil {
		t.Error(err)
	}
	c.Release()
	last := <-done
	if first.who != "tx" {
		t.Errorf("%s ended first (%v) while the transaction's statement, on its held connection, was still waiting "+
			"behind pool statements that wait for that very connection; it ended only afterwards (%s: %v). "+
			"Want it to run at once: running slots were 0 of 1", first.who, first.err, second.who, second.err)
	}
	for _, r := range []result{first, second, last} {
		if r.who == "tx" && r.err != nil {
			t.Errorf("the transaction's statement: %v", r.err)
		}
	}
	pendingEventually(t, "nothing left", func() bool {
		b := poolBudget(t, p, "b")
		return b.InFlight == 0 && b.Waiting == 0 && p.Stat().AcquiredConns() == 0
	})
}

// throttle_when: {in_flight: 1} on a pool of one connection: a pool statement admitted before
// its connection is not in flight while it waits for the connection a transaction holds, so the
// transaction's next statement, on that very connection, is not throttled (the two would wait
// for each other until the transaction's statement was refused, nothing running meanwhile).
func TestPoolPendingNotInFlight(t *testing.T) {
	p := pendingPool(t, 1, `budgets: [{name: b, mode: enforce, max_wait: 3s, throttle_when: {in_flight: 1}}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	pooled := make(chan error, 1)
	go func() {
		_, err := p.Exec(ctx, "select 2")
		pooled <- err
	}()
	pendingEventually(t, "the pool statement is admitted and waits for the connection", func() bool {
		return poolBudget(t, p, "b").InFlight == 1
	})
	if n := p.Snapshot().InFlight; n != 0 {
		t.Errorf("in flight %d while the only statement admitted waits for a connection, want 0", n)
	}
	if _, err := tx.Exec(ctx, "select 3"); err != nil {
		t.Errorf("the transaction's statement, on the connection it holds, was held up by a pool statement "+
			"waiting for that connection (nothing was running): %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-pooled; err != nil {
		t.Errorf("the pool statement: %v", err)
	}
}

// A pool statement overtaken while it waited for its connection, and decided again on it
// (Acquired, admitAgain), re-queues behind pool statements that arrived after it; when the first
// of those is admitted into a pending slot it is woken and runs, as it holds a connection and
// no slot is running, rather than waiting until the next pool statement gives up at its
// max_wait while the one admitted pending waits for the connection it holds.
func TestPoolPendingWakesOvertakenStatement(t *testing.T) {
	p := pendingPool(t, 2, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 5s, max_queue: 8}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	t1, err := p.Begin(ctx) // connection A
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Rollback(context.Background())
	t2, err := p.Begin(ctx) // connection B
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		who string
		err error
	}
	done := make(chan result, 3)
	go func() {
		_, err := p.Exec(ctx, "select 1")
		done <- result{"p1", err}
	}()
	pendingEventually(t, "p1 admitted, pending", func() bool { return poolBudget(t, p, "b").InFlight == 1 })
	// t1's statement overtakes p1's pending slot (it holds a connection): its rows stay open.
	rows, err := t1.Query(ctx, "select generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := p.Exec(ctx, "select 2")
		done <- result{"p2", err}
	}()
	pendingEventually(t, "p2 waits", func() bool { return poolBudget(t, p, "b").Waiting == 1 })
	go func() {
		_, err := p.Exec(ctx, "select 3")
		done <- result{"p3", err}
	}()
	pendingEventually(t, "p3 waits", func() bool { return poolBudget(t, p, "b").Waiting == 2 })
	// p1 gets connection B, finds its slot overtaken, and waits on B behind p2 and p3.
	if err := t2.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	pendingEventually(t, "p1 waits on its connection", func() bool { return poolBudget(t, p, "b").Waiting == 3 })
	// t1's slot comes back: p2 is admitted pending (it needs a connection: A is t1's, B p1's);
	// p1, holding B, should now run: nothing is running.
	rows.Close()
	first := <-done
	second := <-done
	if err := t1.Rollback(ctx); err != nil {
		t.Error(err)
	}
	last := <-done
	if first.who != "p1" {
		t.Errorf("%s ended first (%v); p1, which arrived first and holds a connection, ended after it (%s: %v); "+
			"want p1 to run as soon as t1's slot came back", first.who, first.err, second.who, second.err)
	}
	for _, r := range []result{first, second, last} {
		if r.who == "p1" && r.err != nil {
			t.Errorf("p1: %v", r.err)
		}
	}
	pendingEventually(t, "nothing left", func() bool {
		b := poolBudget(t, p, "b")
		return b.InFlight == 0 && b.Waiting == 0 && p.Stat().AcquiredConns() == 0
	})
}

// Two transactions' statements wait, in arrival order t2 then t3, for a budget of one slot
// whose other slot holder is a pool statement pending for a connection. When the running slot
// comes back they run in arrival order: a statement on a held connection passes the waiters
// that hold none, not those that hold one and came first. The server's sequence records the
// order the two ran in (one slot: they cannot overlap).
func TestPoolPendingConnectedWaitersInOrder(t *testing.T) {
	p := pendingPool(t, 3, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 20s, max_queue: 8}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	if _, err := p.Raw().Exec(ctx, "create sequence s"); err != nil {
		t.Fatal(err)
	}
	inversions := 0
	const trials = 40
	for range trials {
		t1, err := p.Begin(ctx) // the three transactions hold the pool's three connections
		if err != nil {
			t.Fatal(err)
		}
		t2, err := p.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t3, err := p.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pend := make(chan error, 1)
		go func() { _, err := p.Exec(ctx, "select 1"); pend <- err }()
		pendingEventually(t, "the pool statement is pending", func() bool { return poolBudget(t, p, "b").InFlight == 1 })
		rows, err := t1.Query(ctx, "select 1") // overtakes: the running slot, its rows open
		if err != nil {
			t.Fatal(err)
		}
		type ran struct {
			n   int64
			err error
		}
		r2, r3 := make(chan ran, 1), make(chan ran, 1)
		go func() {
			var n int64
			err := t2.QueryRow(ctx, "select nextval('s')").Scan(&n)
			r2 <- ran{n, err}
		}()
		pendingEventually(t, "t2 waits", func() bool { return poolBudget(t, p, "b").Waiting == 1 })
		go func() {
			var n int64
			err := t3.QueryRow(ctx, "select nextval('s')").Scan(&n)
			r3 <- ran{n, err}
		}()
		pendingEventually(t, "t3 waits", func() bool { return poolBudget(t, p, "b").Waiting == 2 })
		rows.Close()
		a, b := <-r2, <-r3
		if a.err != nil || b.err != nil {
			t.Fatalf("t2: %v, t3: %v", a.err, b.err)
		}
		if b.n < a.n {
			inversions++
		}
		t1.Rollback(ctx)
		t2.Rollback(ctx)
		t3.Rollback(ctx)
		if err := <-pend; err != nil {
			t.Fatal(err)
		}
	}
	if inversions > 0 {
		t.Errorf("in %d of %d trials t3's statement ran before t2's, which had waited longer: waiters admitted "+
			"out of arrival order", inversions, trials)
	}
	pendingEventually(t, "nothing left", func() bool {
		b := poolBudget(t, p, "b")
		return b.InFlight == 0 && b.Waiting == 0 && p.Stat().AcquiredConns() == 0
	})
}
