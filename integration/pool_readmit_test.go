package integration

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
)

func poolRules(t *testing.T, yaml string) *driver.Config {
	t.Helper()
	cfg, err := driver.ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

const poolOneSlot = `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 20s, max_queue: 2}]
rules: [{budget: b, match: {app: x}}]
`

// poolOvertake makes run, a pool statement started in a goroutine, wait in Acquired's
// re-admission: admitted pending on a pool of 2, overtaken by a query on a PoolConn, then given
// the second connection. It returns what to call to end the overtaking query.
func poolOvertake(t *testing.T, p *driver.Pool, run func()) (closeOvertaker func()) {
	t.Helper()
	ctx := pendingCtx
	c1, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := p.Raw().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	go run()
	pendingEventually(t, "pending", func() bool { return poolBudget(t, p, "b").InFlight == 1 })
	rows, err := c1.Query(ctx, "select generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	raw.Release()
	pendingEventually(t, "re-admission waits", func() bool {
		return poolBudget(t, p, "b").Waiting == 1 && p.Stat().AcquiredConns() == 2
	})
	return func() { rows.Close(); c1.Release() }
}

// Rules replaced while a statement waits in Acquired's re-admission (ErrDecideAgain): the
// statement is decided again on its connection under the new rules and runs; then a batch the
// same way. Nothing leaks.
func TestPoolReloadDuringReadmission(t *testing.T) {
	p := pendingPool(t, 2, poolOneSlot)
	res := make(chan error, 1)
	done := poolOvertake(t, p, func() { _, err := p.Exec(pendingCtx, "select 1"); res <- err })
	if err := p.SetConfig(poolRules(t, `budgets: [{name: b, mode: enforce, max_concurrent: 5, max_wait: 20s, max_queue: 2}]
rules: [{budget: b, match: {app: x}}]
`)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-res:
		if err != nil {
			t.Errorf("statement decided again after the reload: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("statement in re-admission not decided again after the reload")
	}
	done()
	poolHoldsNothing(t, p, "statement after reload during re-admission")

	if err := p.SetConfig(poolRules(t, poolOneSlot)); err != nil {
		t.Fatal(err)
	}
	done = poolOvertake(t, p, func() {
		b := &pgx.Batch{}
		b.Queue("select 1")
		b.Queue("select 2")
		br := p.SendBatch(pendingCtx, b)
		_, err := br.Exec()
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		res <- err
	})
	if err := p.SetConfig(poolRules(t, `budgets: [{name: b, mode: enforce, max_concurrent: 5, max_wait: 20s, max_queue: 2}]
rules: [{budget: b, match: {app: x}}]
`)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-res:
		if err != nil {
			t.Errorf("batch decided again after the reload: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("batch in re-admission not decided again after the reload")
	}
	done()
	poolHoldsNothing(t, p, "batch after reload during re-admission")

	// Close while a statement waits in re-admission: ErrClosed at once, connection back.
	if err := p.SetConfig(poolRules(t, poolOneSlot)); err != nil {
		t.Fatal(err)
	}
	done = poolOvertake(t, p, func() { _, err := p.Exec(pendingCtx, "select 1"); res <- err })
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case err := <-res:
		if !errors.Is(err, driver.ErrClosed) {
			t.Errorf("re-admission at Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("re-admission not answered at Close")
	}
	done()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung")
	}
}

const poolLongQueue = `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 30s, max_queue: 64}]
rules: [{budget: b, match: {app: x}}]
`

// A statement waiting in Acquired's re-admission when the rules are replaced by rules with
// none (an operator empties the rules list) is decided again under them and runs. Its ticket
// goes back to the runner's pool for later statements. Once the rules are back, waiters must
// be admitted in arrival order: a later statement must not take the old place in the queue
// of the statement that waited before, nor pass max_queue.
func TestPoolReadmissionUnderEmptyRulesLeavesNoPlace(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))  // one P: one sync.Pool shard of tickets
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no GC to empty the runner's pool of tickets
	p := pendingPool(t, 2, poolLongQueue)
	ctx := pendingCtx
	res := make(chan error, 1)
	done := poolOvertake(t, p, func() { _, err := p.Exec(ctx, "select pg_sleep(1)"); res <- err })
	if err := p.SetConfig(poolRules(t, "budgets: [{name: b, mode: enforce, max_concurrent: 1}]\nrules: []\n")); err != nil {
		t.Fatal(err)
	}
	done() // the overtaking rows
	// While the statement sleeps under no rules, the rules come back, a slot is held, and two
	// statements wait.
	if err := p.SetConfig(poolRules(t, poolLongQueue)); err != nil {
		t.Fatal(err)
	}
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := c.Query(ctx, "select generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	launch := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := p.Exec(ctx, "select pg_sleep(0.002)"); err != nil {
				t.Errorf("statement %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
		}()
		pendingEventually(t, "it waits", func() bool { return poolBudget(t, p, "b").Waiting == i+1 })
	}
	launch(0)
	launch(1)
	select {
	case err := <-res:
		if err != nil {
			t.Fatalf("the statement decided again under no rules: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the statement decided again under no rules never ended")
	}
	// Newcomers, one after the other, each waiting (holding a ticket of the runner's pool).
	for i := 2; i < 40; i++ {
		launch(i)
	}
	rows.Close()
	wg.Wait()
	for i, v := range order {
		if v != i {
			t.Errorf("admission order %v, want arrival order 0..39: statement %d ran %dth", order, v, i+1)
			break
		}
	}
	c.Release()
	poolHoldsNothing(t, p, "after")
}

// A batch cancelled while it waits in Acquired's re-admission gives its connection and slots
// back; an empty batch runs; a transaction's statement cancelled while queued leaves the
// transaction usable.
func TestPoolBatchReadmissionCancelAndEdges(t *testing.T) {
	p := pendingPool(t, 2, poolOneSlot)
	ctx := pendingCtx
	cctx, cancel := context.WithCancel(ctx)
	res := make(chan error, 1)
	done := poolOvertake(t, p, func() {
		b := &pgx.Batch{}
		b.Queue("select 1")
		br := p.SendBatch(cctx, b)
		_, err := br.Exec()
		br.Close()
		res <- err
	})
	cancel()
	select {
	case err := <-res:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("batch cancelled during re-admission: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("batch cancelled during re-admission not answered")
	}
	done()
	poolHoldsNothing(t, p, "batch cancelled in re-admission")

	// An empty batch.
	br := p.SendBatch(ctx, &pgx.Batch{})
	if err := br.Close(); err != nil {
		t.Errorf("empty batch: %v", err)
	}
	poolHoldsNothing(t, p, "empty batch")

	// A transaction's statement cancelled while it waits for the slot; the transaction goes on.
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := p.Query(ctx, "select generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	tctx, tcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = tx.Exec(tctx, "select 1")
	tcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("tx statement past its deadline while queued: %v", err)
	}
	rows.Close()
	var n int
	if err := tx.QueryRow(ctx, "select 7").Scan(&n); err != nil || n != 7 {
		t.Errorf("the transaction after its statement gave up waiting: %v %d", err, n)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Error(err)
	}
	poolHoldsNothing(t, p, "tx after cancelled wait")
}

// README (Reloads): statements waiting under max_wait are decided again under new rules, "its
// max_wait still counted from its arrival". A pool statement overtaken while it waited for its
// connection waits again, up to max_wait, on its connection (README: "it may wait up to
// max_wait then"). A reload during that wait must not restart its max_wait: it is refused at
// most max_wait after that wait began (here 3 s, reload at 2 s), not max_wait after the reload.
func TestPoolReloadDuringReadmissionKeepsMaxWait(t *testing.T) {
	const rules = `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 3s, max_queue: %d}]
rules: [{budget: b, match: {app: x}}]
`
	p := pendingPool(t, 2, fmt.Sprintf(rules, 4))
	res := make(chan error, 1)
	done := poolOvertake(t, p, func() { _, err := p.Exec(pendingCtx, "select 1"); res <- err })
	defer done()
	waitStart := time.Now()
	time.Sleep(2 * time.Second)
	// Rules that still refuse it (the slot is still held): only max_queue changed.
	if err := p.SetConfig(poolRules(t, fmt.Sprintf(rules, 5))); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-res:
		took := time.Since(waitStart)
		t.Logf("refused %v after its wait on its connection began: %v", took, err)
		if !errors.Is(err, driver.ErrBlocked) {
			t.Errorf("want a refusal at max_wait, got %v", err)
		}
		if took > 4200*time.Millisecond {
			t.Errorf("waited %v on its connection with max_wait 3s: the reload restarted its max_wait", took)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("never answered")
	}
}

// The same for a batch.
func TestPoolBatchReloadDuringReadmissionKeepsMaxWait(t *testing.T) {
	const rules = `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 3s, max_queue: %d}]
rules: [{budget: b, match: {app: x}}]
`
	p := pendingPool(t, 2, fmt.Sprintf(rules, 4))
	res := make(chan error, 1)
	done := poolOvertake(t, p, func() {
		b := &pgx.Batch{}
		b.Queue("select 1")
		br := p.SendBatch(pendingCtx, b)
		_, err := br.Exec()
		br.Close()
		res <- err
	})
	defer done()
	waitStart := time.Now()
	time.Sleep(2 * time.Second)
	if err := p.SetConfig(poolRules(t, fmt.Sprintf(rules, 5))); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-res:
		took := time.Since(waitStart)
		t.Logf("refused %v after its wait on its connection began: %v", took, err)
		if !errors.Is(err, driver.ErrBlocked) {
			t.Errorf("want a refusal at max_wait, got %v", err)
		}
		if took > 4200*time.Millisecond {
			t.Errorf("batch waited %v on its connection with max_wait 3s: the reload restarted its max_wait", took)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("never answered")
	}
}
