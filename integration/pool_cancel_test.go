package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
)

// poolHoldsNothing waits until nothing is held: no statement in flight in the engine, no budget slot
// in flight or waiter, and no pgxpool connection acquired.
func poolHoldsNothing(t *testing.T, p *driver.Pool, stage string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := p.Snapshot()
		ok := s.InFlight == 0 && p.Stat().AcquiredConns() == 0
		var bad []string
		for _, b := range s.Budgets {
			if b.InFlight != 0 || b.Waiting != 0 {
				ok = false
				bad = append(bad, fmt.Sprintf("%s in_flight=%d waiting=%d", b.Name, b.InFlight, b.Waiting))
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: leaked: engine in_flight=%d, acquired conns=%d, budgets %v", stage, s.InFlight,
				p.Stat().AcquiredConns(), bad)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type panicScanner struct{}

func (panicScanner) Scan(any) error { panic("scan target panics") }

// Context cancelled at every stage of a pool statement's life, and the other ways a statement
// can end badly: each leaves nothing held.
func TestPoolCancelEveryStage(t *testing.T) {
	p := pendingPool(t, 2, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 10s, max_queue: 4}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx

	// 1. Cancelled while queued for a slot (holding no connection).
	rows, err := p.Query(ctx, "select generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	{
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := p.Exec(cctx, "select 1")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("queued: %v", err)
		}
		if n := p.Stat().AcquiredConns(); n != 1 {
			t.Errorf("queued statement took a connection: %d acquired", n)
		}
	}
	rows.Close()
	poolHoldsNothing(t, p, "cancel while queued")

	// 2. Cancelled after admission, while waiting for a pool connection.
	r1, err := p.Raw().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := p.Raw().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	{
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := p.Exec(cctx, "select 2")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("waiting for a connection: %v", err)
		}
	}
	if s := p.Snapshot(); s.InFlight != 0 || poolBudget(t, p, "b").InFlight != 0 {
		t.Errorf("after a statement gave up waiting for a connection: engine %d budget %+v", s.InFlight, poolBudget(t, p, "b"))
	}
	r1.Release()
	r2.Release()
	poolHoldsNothing(t, p, "cancel while waiting for a connection")

	// 3. Cancelled during Acquired's re-admission: admitted pending, overtaken by a statement on
	// a held connection, then given a connection and made to wait for a slot.
	c1, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := p.Raw().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	res := make(chan error, 1)
	go func() { _, err := p.Exec(cctx, "select 3"); res <- err }()
	pendingEventually(t, "pending", func() bool { return poolBudget(t, p, "b").InFlight == 1 })
	crow, err := c1.Query(ctx, "select generate_series(1, 3)") // overtakes the pending slot
	if err != nil {
		t.Fatal(err)
	}
	raw.Release() // the pending statement gets it, finds its slot overtaken, waits
	pendingEventually(t, "re-admission waits", func() bool {
		return poolBudget(t, p, "b").Waiting == 1 && p.Stat().AcquiredConns() == 2
	})
	cancel()
	select {
	case err := <-res:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled during re-admission: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancel during re-admission not answered")
	}
	crow.Close()
	c1.Release()
	poolHoldsNothing(t, p, "cancel during re-admission")

	// 4. Cancelled mid-rows, before Close.
	{
		qctx, cancel := context.WithCancel(ctx)
		rows, err := p.Query(qctx, "select pg_sleep(0.01), g from generate_series(1, 200) g")
		if err != nil {
			t.Fatal(err)
		}
		if !rows.Next() {
			t.Fatal(rows.Err())
		}
		cancel()
		for rows.Next() {
		}
		rows.Close()
		if rows.Err() == nil {
			t.Log("rows ended with no error after cancel")
		}
	}
	poolHoldsNothing(t, p, "cancel mid-rows")

	// 5. QueryRow Scan errors: wrong type, no rows, query error.
	var s string
	if err := p.QueryRow(ctx, "select 1::int").Scan(&s); err == nil {
		// pgx scans int into string? then try a type that must fail
		t.Log("int scanned into string")
	}
	var i int
	if err := p.QueryRow(ctx, "select 'x'").Scan(&i); err == nil {
		t.Error("text scanned into int")
	}
	if err := p.QueryRow(ctx, "select 1 where false").Scan(&i); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("no rows: %v", err)
	}
	if err := p.QueryRow(ctx, "select 1/0").Scan(&i); err == nil {
		t.Error("division by zero scanned")
	}
	poolHoldsNothing(t, p, "QueryRow scan errors")

	// 6. A panic in a Scan target: QueryRow's and Query's.
	func() {
		defer func() {
			if recover() == nil {
				t.Error("QueryRow Scan: no panic")
			}
		}()
		p.QueryRow(ctx, "select 1").Scan(panicScanner{})
	}()
	poolHoldsNothing(t, p, "panic in QueryRow Scan")
	func() {
		rows, err := p.Query(ctx, "select g from generate_series(1, 3) g")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		defer func() {
			if recover() == nil {
				t.Error("rows.Scan: no panic")
			}
		}()
		for rows.Next() {
			rows.Scan(panicScanner{})
		}
	}()
	poolHoldsNothing(t, p, "panic in rows Scan")

	// 7. A transaction aborted by an error: its next statement fails with the server's error.
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "select 1/0"); err == nil {
		t.Error("1/0 succeeded")
	}
	if _, err := tx.Exec(ctx, "select 1"); err == nil {
		t.Error("a statement in an aborted transaction succeeded")
	}
	if err := tx.QueryRow(ctx, "select 1").Scan(&i); err == nil {
		t.Error("QueryRow in an aborted transaction succeeded")
	}
	if b := poolBudget(t, p, "b"); b.InFlight != 0 {
		t.Errorf("aborted tx statements hold slots: %+v", b)
	}
	tx.Rollback(ctx)
	poolHoldsNothing(t, p, "aborted tx")

	// 8. A batch whose results are not read, and one whose context is cancelled before Close.
	b := &pgx.Batch{}
	b.Queue("select 1")
	b.Queue("select pg_sleep(0.05)")
	b.Queue("select 1/0")
	b.Queue("select 3")
	br := p.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		t.Error(err)
	}
	br.Close()
	poolHoldsNothing(t, p, "batch partly read")
	bctx, bcancel := context.WithCancel(ctx)
	b = &pgx.Batch{}
	b.Queue("select pg_sleep(2)")
	b.Queue("select 1")
	br = p.SendBatch(bctx, b)
	time.Sleep(50 * time.Millisecond)
	bcancel()
	br.Close()
	poolHoldsNothing(t, p, "batch cancelled")

	// 9. CopyFrom whose source fails midway.
	if _, err := p.Exec(ctx, "create table copy_src_fails (a int)"); err != nil {
		t.Fatal(err)
	}
	n := 0
	_, err = p.CopyFrom(ctx, pgx.Identifier{"copy_src_fails"}, []string{"a"}, pgx.CopyFromFunc(func() ([]any, error) {
		n++
		if n > 3 {
			return nil, errors.New("source broke")
		}
		return []any{n}, nil
	}))
	if err == nil {
		t.Error("CopyFrom with a failing source succeeded")
	}
	poolHoldsNothing(t, p, "copy failed")
}
