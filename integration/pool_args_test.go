package integration

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

func rvIdle(t *testing.T, p *driver.Pool, budget string) {
	t.Helper()
	pendingEventually(t, "budget "+budget+" idle and no connection acquired", func() bool {
		b := poolBudget(t, p, budget)
		return b.InFlight == 0 && b.Waiting == 0 && p.Stat().AcquiredConns() == 0
	})
}

// NamedArgs (a pgx QueryRewriter) on a write guarded by require_where.
func TestPoolFrontNamedArgsGuard(t *testing.T) {
	p := pendingPool(t, 2, `guards: {require_where: enforce}
budgets: [{name: b, mode: enforce, max_concurrent: 2, per_query_limit: 10s}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	if _, err := p.Exec(ctx, "create table items (id int, tenant_id int)"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, "insert into items values (1, 1), (2, 2)"); err != nil {
		t.Fatal(err)
	}
	tag, err := p.Exec(ctx, "delete from items where id = @id", pgx.NamedArgs{"id": 1})
	if err != nil || tag.RowsAffected() != 1 {
		t.Errorf("delete with NamedArgs: %v %v", tag, err)
	}
	tag, err = p.Exec(ctx, "update items set id = 3 where tenant_id = @tenant_id", pgx.NamedArgs{"tenant_id": 2})
	if err != nil || tag.RowsAffected() != 1 {
		t.Errorf("update with NamedArgs: %v %v", tag, err)
	}
	var n int
	if err := p.QueryRow(ctx, "select count(*) from items where id = @id", pgx.NamedArgs{"id": 3}).Scan(&n); err != nil || n != 1 {
		t.Errorf("select with NamedArgs: %d %v", n, err)
	}
	rvIdle(t, p, "b")
}

// Exec modes passed as the first argument, with a costed budget (EXPLAIN path).
func TestPoolFrontExecModes(t *testing.T) {
	p := pendingPool(t, 2, `budgets: [{name: b, mode: enforce, max_concurrent: 2, per_query_limit: 10s, server_share: 0.9}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec,
		pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec, pgx.QueryExecModeCacheStatement} {
		for i := 0; i < 3; i++ {
			var n int
			if err := p.QueryRow(ctx, "select $1::int + 1", mode, 41).Scan(&n); err != nil || n != 42 {
				t.Errorf("mode %v: %d %v", mode, n, err)
			}
			rows, err := p.Query(ctx, "select generate_series(1, $1::int)", mode, 3)
			if err != nil {
				t.Fatalf("mode %v: %v", mode, err)
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			if err != nil || len(got) != 3 {
				t.Errorf("mode %v rows %v %v", mode, got, err)
			}
			if _, err := p.Exec(ctx, "select $1::text", mode, "x"); err != nil {
				t.Errorf("mode %v exec: %v", mode, err)
			}
		}
	}
	rvIdle(t, p, "b")
}

// Context cancelled while waiting for capacity: the context's error, nothing held.
func TestPoolFrontCancelWhileWaitingForCapacity(t *testing.T) {
	p := pendingPool(t, 2, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 20s}]
rules: [{budget: b, match: {app: x}}]
`)
	rows, err := p.Query(pendingCtx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(pendingCtx)
	done := make(chan error, 1)
	go func() {
		_, err := p.Exec(ctx, "select 2")
		done <- err
	}()
	pendingEventually(t, "waiting", func() bool { return poolBudget(t, p, "b").Waiting == 1 })
	cancel()
	err = <-done
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled wait: %T %v, want context.Canceled", err, err)
	}
	// A deadline shorter than max_wait.
	dctx, dcancel := context.WithTimeout(pendingCtx, 200*time.Millisecond)
	defer dcancel()
	_, err = p.Exec(dctx, "select 3")
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, driver.ErrBlocked) {
		t.Errorf("deadline wait: %T %v", err, err)
	}
	rows.Close()
	rvIdle(t, p, "b")
}

// A tx aborted by an error: the next statement (new pattern, costed budget: EXPLAIN in a
// savepoint) returns the server's 25P02; rollback works; nothing is held.
func TestPoolFrontTxAbortedKeepsPgError(t *testing.T) {
	p := pendingPool(t, 2, `budgets: [{name: b, mode: enforce, max_concurrent: 2, per_query_limit: 10s, server_share: 0.9}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, "select 1/0")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "22012" {
		t.Fatalf("division: %T %v", err, err)
	}
	_, err = tx.Exec(ctx, "select 2 + $1::int", 1)
	if !errors.As(err, &pe) || pe.Code != "25P02" {
		t.Errorf("after abort: %T %v, want PgError 25P02", err, err)
	}
	var n int
	err = tx.QueryRow(ctx, "select 3 + $1::int", 1).Scan(&n)
	if !errors.As(err, &pe) || pe.Code != "25P02" {
		t.Errorf("QueryRow after abort: %T %v, want PgError 25P02", err, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Errorf("rollback: %v", err)
	}
	rvIdle(t, p, "b")
	// Nested savepoints: an error inside the inner one, rolled back, outer goes on.
	tx, err = p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "create table t (id int primary key)"); err != nil {
		t.Fatal(err)
	}
	inner, err := tx.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inner.Exec(ctx, "insert into t values (1)"); err != nil {
		t.Fatal(err)
	}
	inner2, err := inner.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inner2.Exec(ctx, "insert into t values (1)"); !errors.As(err, &pe) || pe.Code != "23505" {
		t.Errorf("duplicate: %T %v", err, err)
	}
	if err := inner2.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := inner.Exec(ctx, "insert into t values (2)"); err != nil {
		t.Errorf("after inner rollback: %v", err)
	}
	if err := inner.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, "select count(*) from t").Scan(&n); err != nil || n != 2 {
		t.Errorf("count %d %v", n, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rvIdle(t, p, "b")
}

// Batch with an error in the middle: PgError preserved; everything given back.
func TestPoolFrontBatchErrorMidway(t *testing.T) {
	p := pendingPool(t, 1, `budgets: [{name: b, mode: enforce, max_concurrent: 1, per_query_limit: 10s, server_share: 0.9}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	if _, err := p.Exec(ctx, "create table t (id int primary key)"); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 2; round++ {
		b := &pgx.Batch{}
		b.Queue("insert into t values ($1)", 10+round)
		b.Queue("select 1/0")
		b.Queue("select $1::int", 3)
		br := p.SendBatch(ctx, b)
		if _, err := br.Exec(); err != nil {
			t.Fatal(err)
		}
		_, err := br.Exec()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "22012" {
			t.Errorf("round %d: mid-batch error %T %v", round, err, err)
		}
		var n int
		if err := br.QueryRow().Scan(&n); err == nil {
			t.Errorf("round %d: statement after the error succeeded", round)
		}
		br.Close()
		rvIdle(t, p, "b")
	}
	// Callbacks, results closed without reading.
	var calls atomic.Int32
	b := &pgx.Batch{}
	b.Queue("select 1").QueryRow(func(r pgx.Row) error { var n int; calls.Add(1); return r.Scan(&n) })
	b.Queue("select generate_series(1,3)").Query(func(r pgx.Rows) error {
		calls.Add(1)
		for r.Next() {
		}
		return nil
	})
	b.Queue("insert into t values (100)").Exec(func(pgconn.CommandTag) error { calls.Add(1); return nil })
	if err := p.SendBatch(ctx, b).Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if calls.Load() != 3 {
		t.Errorf("callbacks %d, want 3", calls.Load())
	}
	rvIdle(t, p, "b")
	// Results closed without reading any.
	b = &pgx.Batch{}
	b.Queue("select 1")
	b.Queue("select pg_sleep(0.05)")
	br := p.SendBatch(ctx, b)
	if err := br.Close(); err != nil {
		t.Errorf("close unread: %v", err)
	}
	rvIdle(t, p, "b")
	// An empty batch.
	if err := p.SendBatch(ctx, &pgx.Batch{}).Close(); err != nil {
		t.Errorf("empty batch: %v", err)
	}
	rvIdle(t, p, "b")
}

// A batch under per: tenant, max_concurrent 1: one batch is one statement in flight.
func TestPoolFrontBatchPerTenant(t *testing.T) {
	p := pendingPool(t, 2, `budgets: [{name: b, mode: enforce, per: tenant, max_concurrent: 1}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := tagging.With(pendingCtx, "tenant", "7")
	b := &pgx.Batch{}
	b.Queue("select 1")
	b.Queue("select 2")
	b.Queue("select 3 /*tenant='8'*/")
	br := p.SendBatch(ctx, b)
	for i := 0; i < 3; i++ {
		if _, err := br.Exec(); err != nil {
			t.Errorf("statement %d: %v", i, err)
		}
	}
	if err := br.Close(); err != nil {
		t.Error(err)
	}
	rvIdle(t, p, "b")
}

// CopyFrom cancelled mid-way, and refused.
type rvCopySrc struct {
	n, cancelAt int
	cancel      func()
	read        int
}

func (s *rvCopySrc) Next() bool {
	if s.read == s.cancelAt && s.cancel != nil {
		s.cancel()
		time.Sleep(50 * time.Millisecond)
	}
	s.read++
	return s.read <= s.n
}
func (s *rvCopySrc) Values() ([]any, error) {
	return []any{int32(s.read), "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}, nil
}
func (s *rvCopySrc) Err() error { return nil }

func TestPoolFrontCopyFromCancelAndRefuse(t *testing.T) {
	p := pendingPool(t, 1, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 100ms}]
rules: [{budget: b, match: {statement: copy}}, {budget: b, match: {app: x}}]
`)
	ctx := context.Background()
	if _, err := p.Exec(ctx, "create table items (id int, name text)"); err != nil {
		t.Fatal(err)
	}
	n, err := p.CopyFrom(ctx, pgx.Identifier{"public", "items"}, []string{"id", "name"}, &rvCopySrc{n: 200000, cancelAt: -1})
	if err != nil || n != 200000 {
		t.Fatalf("large copy %d %v", n, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	_, err = p.CopyFrom(cctx, pgx.Identifier{"items"}, []string{"id", "name"}, &rvCopySrc{n: 200000, cancelAt: 1000, cancel: cancel})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled copy: %T %v", err, err)
	}
	rvIdle(t, p, "b")
	rows, err := p.Query(pendingCtx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	src := &rvCopySrc{n: 10, cancelAt: -1}
	_, err = p.CopyFrom(ctx, pgx.Identifier{"items"}, []string{"id", "name"}, src)
	asBlocked(t, err)
	if src.read != 0 {
		t.Errorf("refused copy read %d rows", src.read)
	}
	rows.Close()
	var c int
	if err := p.QueryRow(ctx, "select count(*) from items").Scan(&c); err != nil || c != 200000 {
		t.Errorf("count %d %v", c, err)
	}
	rvIdle(t, p, "b")
}
