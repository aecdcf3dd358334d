package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	pgtdriver "github.com/pgtraffic/pgtraffic/driver"
)

func overrunPoolIdle(t *testing.T, p *pgtdriver.Pool, step string) {
	t.Helper()
	if !eventually(5*time.Second, func() bool {
		return p.Snapshot().InFlight == 0 && poolBudget(t, p, "b").InFlight == 0 && p.Stat().AcquiredConns() == 0
	}) {
		t.Errorf("%s: in flight %d, budget in flight %d, acquired %d", step, p.Snapshot().InFlight,
			poolBudget(t, p, "b").InFlight, p.Stat().AcquiredConns())
	}
}

func overrunPoolUsable(t *testing.T, p *pgtdriver.Pool, step string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(pendingCtx, 5*time.Second)
	defer cancel()
	var n int
	if err := p.QueryRow(ctx, "select 7").Scan(&n); err != nil || n != 7 {
		t.Errorf("%s: the pool's next statement: %v", step, err)
	}
}

// Every pool statement kind cut at its max_duration, on a pool of one connection: the error
// matches ErrOverrun, nothing is left in flight or acquired, and the pool's one connection
// serves the next statement.
func TestOverrunPoolKinds(t *testing.T) {
	p := pendingPool(t, 1, `budgets: [{name: b, mode: enforce, max_duration: 300ms}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	if _, err := p.Exec(ctx, "create table overrun_copy (n int)"); err != nil {
		t.Fatal(err)
	}
	over := func(step string, err error) {
		t.Helper()
		if !errors.Is(err, pgtdriver.ErrOverrun) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: %T %v, want ErrOverrun", step, err, err)
		}
		overrunPoolIdle(t, p, step)
		overrunPoolUsable(t, p, step)
	}
	_, err := p.Exec(ctx, "select pg_sleep(5)")
	over("exec", err)

	var s string
	over("queryrow", p.QueryRow(ctx, "select pg_sleep(5)::text").Scan(&s))

	rows, err := p.Query(ctx, "select pg_sleep(0.1)::text from generate_series(1, 50)")
	if err == nil {
		for rows.Next() {
		}
		err = rows.Err()
		rows.Close()
	}
	over("query", err)

	// Rows closed early while the server still produces them.
	rows, err = p.Query(ctx, "select repeat('x', 65536), pg_sleep(case when g < 2 then 0 else 2 end) from generate_series(1, 4) g")
	if err != nil {
		t.Fatal(err)
	}
	rows.Next()
	rows.Close()
	t.Logf("rows closed early: Err %v", rows.Err())
	over("rows close", rows.Err())

	b := &pgx.Batch{}
	b.Queue("select pg_sleep(5)")
	over("batch", p.SendBatch(ctx, b).Close())

	sent := 0
	_, err = p.CopyFrom(ctx, pgx.Identifier{"overrun_copy"}, []string{"n"}, pgx.CopyFromFunc(func() ([]any, error) {
		if sent == 5_000_000 {
			return nil, nil
		}
		sent++
		return []any{sent}, nil
	}))
	over("copy", err)

	// A PoolConn: its statement cut, the next on the same PoolConn fails or runs, the release
	// gives the pool a usable connection.
	pc, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = pc.Exec(ctx, "select pg_sleep(5)")
	if !errors.Is(err, pgtdriver.ErrOverrun) {
		t.Errorf("poolconn: %v", err)
	}
	_, err2 := pc.Exec(ctx, "select 1")
	t.Logf("poolconn's next statement: %v", err2)
	pc.Release()
	overrunPoolIdle(t, p, "poolconn")
	overrunPoolUsable(t, p, "poolconn")

	// A transaction.
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, "select pg_sleep(5)")
	if !errors.Is(err, pgtdriver.ErrOverrun) {
		t.Errorf("tx: %v", err)
	}
	_, err2 = tx.Exec(ctx, "select 1")
	t.Logf("tx's next statement: %v", err2)
	if err2 == nil {
		t.Errorf("the transaction ran a statement after its cancelled one")
	}
	t.Logf("rollback: %v", tx.Rollback(context.Background()))
	overrunPoolIdle(t, p, "tx")
	overrunPoolUsable(t, p, "tx")
	t.Logf("budget: blocked %v", poolBudget(t, p, "b").BlockedBy)
}

// A batch [a cheap lookup, a slow report] cut at its max_duration under quarantine
// {after: 1}: every result reports the cancellation, the lookup's too (the server sends a
// pipeline's results at its end), so which statement overran is unknown. The lookup, which ran
// in microseconds, must never be quarantined: a batch of several statements strikes none.
func TestOverrunPoolBatchStrikesNobody(t *testing.T) {
	p := pendingPool(t, 2, `budgets: [{name: b, mode: enforce, max_duration: 200ms, quarantine: {after: 1, for: 20s}}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	if _, err := p.Exec(ctx, "create table overrun_users (id int primary key)"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, "select id from overrun_users where id = $1", 1); err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue("select id from overrun_users where id = $1", 1)
	b.Queue("select pg_sleep(5)")
	br := p.SendBatch(ctx, b)
	_, err1 := br.Exec()
	_, err2 := br.Exec()
	err3 := br.Close()
	t.Logf("batch results: lookup %v; report %v; close %v", err1, err2, err3)
	if !errors.Is(err2, pgtdriver.ErrOverrun) {
		t.Fatalf("report: %v", err2)
	}
	overrunPoolIdle(t, p, "batch")
	for _, q := range p.Snapshot().Quarantines {
		t.Logf("quarantined: %s (%s)", q.Query, q.Fingerprint)
	}
	if _, err := p.Exec(ctx, "select id from overrun_users where id = $1", 2); err != nil {
		t.Errorf("the lookup, which ran in a few microseconds, after the batch: %v", err)
	}
	if q := p.Snapshot().Quarantines; len(q) != 0 {
		t.Errorf("quarantines after a batch of two overran: %+v, want none", q)
	}
}

// A quarantine refuses a pool statement of every kind (Exec, QueryRow, Query, a batch holding
// the pattern, a transaction's) at once, reason quarantine, with a RetryAfter; other patterns
// of the budget run, and a transaction goes on after a refusal.
func TestOverrunPoolQuarantineKinds(t *testing.T) {
	p := pendingPool(t, 2, `budgets: [{name: b, mode: enforce, max_duration: 200ms, quarantine: {after: 1, for: 20s}}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	if _, err := p.Exec(ctx, "select pg_sleep(5)"); !errors.Is(err, pgtdriver.ErrOverrun) {
		t.Fatalf("exec: %v", err)
	}
	overrunPoolIdle(t, p, "exec")
	quarantined := func(step string, err error) {
		t.Helper()
		var be *pgtdriver.BlockedError
		if !errors.As(err, &be) || be.Reason != pgtdriver.ReasonQuarantine || be.RetryAfter <= 0 || be.RetryAfter > 20*time.Second {
			t.Errorf("%s: %v (%+v), want reason quarantine with RetryAfter in (0, 20s]", step, err, be)
		}
	}
	t0 := time.Now()
	_, err := p.Exec(ctx, "select pg_sleep(5)")
	quarantined("exec", err)
	var s string
	quarantined("queryrow", p.QueryRow(ctx, "select pg_sleep(5)").Scan(&s))
	_, err = p.Query(ctx, "select pg_sleep(5)")
	quarantined("query", err)
	b := &pgx.Batch{}
	b.Queue("select 1")
	b.Queue("select pg_sleep(5)")
	quarantined("batch", p.SendBatch(ctx, b).Close())
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, "select pg_sleep(5)")
	quarantined("tx", err)
	if _, err := tx.Exec(ctx, "select 1"); err != nil {
		t.Errorf("the transaction after a refusal: %v", err)
	}
	tx.Rollback(ctx)
	if d := time.Since(t0); d > 3*time.Second {
		t.Errorf("refusals took %v", d)
	}
	if _, err := p.Exec(ctx, "select 1"); err != nil {
		t.Errorf("select 1: %v", err)
	}
	overrunPoolIdle(t, p, "after")
}
