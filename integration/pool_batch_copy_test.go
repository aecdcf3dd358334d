package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// Mixed traffic on a small pool: the number of results open at once never exceeds
// max_concurrent, and everything comes back at the end.
func TestPoolFrontStressInvariant(t *testing.T) {
	for _, maxConns := range []int32{1, 2} {
		t.Run(fmt.Sprint(maxConns), func(t *testing.T) {
			p := pendingPool(t, maxConns, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 300ms, max_queue: 6}]
rules: [{budget: b, match: {app: x}}]
`)
			ctx := pendingCtx
			var open, maxOpen atomic.Int32
			enter := func() {
				n := open.Add(1)
				for {
					m := maxOpen.Load()
					if n <= m || maxOpen.CompareAndSwap(m, n) {
						break
					}
				}
			}
			var wg sync.WaitGroup
			var other atomic.Value
			var kinds sync.Map
			for g := 0; g < 6; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					r := rand.New(rand.NewSource(int64(g)))
					for i := 0; i < 40; i++ {
						cctx, cancel := context.WithTimeout(ctx, time.Duration(r.Intn(400))*time.Millisecond)
						var err error
						kind := r.Intn(5)
						switch kind {
						case 0: // pool query
							var rows pgx.Rows
							rows, err = p.Query(cctx, "select pg_sleep(0.002)")
							if err == nil {
								enter()
								for rows.Next() {
								}
								open.Add(-1)
								rows.Close()
								err = rows.Err()
							}
						case 1: // tx
							var tx pgx.Tx
							tx, err = p.Begin(cctx)
							if err == nil {
								var rows pgx.Rows
								rows, err = tx.Query(cctx, "select pg_sleep(0.002)")
								if err == nil {
									enter()
									rows.Close()
									open.Add(-1)
								}
								tx.Rollback(context.Background())
							}
						case 2: // batch
							b := &pgx.Batch{}
							b.Queue("select 1")
							b.Queue("select pg_sleep(0.002)")
							br := p.SendBatch(cctx, b)
							_, err = br.Exec()
							if err == nil {
								enter()
								open.Add(-1)
							}
							br.Close()
						case 3: // PoolConn
							var c *driver.PoolConn
							c, err = p.Acquire(cctx)
							if err == nil {
								var rows pgx.Rows
								rows, err = c.Query(cctx, "select pg_sleep(0.002)")
								if err == nil {
									enter()
									rows.Close()
									open.Add(-1)
								}
								c.Release()
							}
						case 4: // QueryRow
							var n int
							err = p.QueryRow(cctx, "select 1").Scan(&n)
						}
						cancel()
						if err != nil && !errors.Is(err, driver.ErrBlocked) && !errors.Is(err, context.DeadlineExceeded) {
							kinds.Store(kind, err)
							other.Store(err)
						}
					}
				}(g)
			}
			wg.Wait()
			kinds.Range(func(k, v any) bool { t.Logf("kind %v: %T %v", k, v, v); return true })
			if m := maxOpen.Load(); m > 1 {
				t.Errorf("%d results open at once under max_concurrent 1", m)
			}
			rvIdle(t, p, "b")
			// The pool still works.
			if _, err := p.Exec(ctx, "select 1"); err != nil {
				t.Error(err)
			}
			_ = tagging.With
		})
	}
}

// A statement admitted while waiting for the connection the PoolConn holds; max_duration is
// counted from when it has its connection.
func TestPoolFrontMaxDurationAfterPendingWait(t *testing.T) {
	p := pendingPool(t, 1, `budgets: [{name: b, mode: enforce, max_concurrent: 2, max_duration: 400ms}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	go func() {
		_, err := p.Exec(ctx, "select pg_sleep(0.1)")
		done <- err
	}()
	go func() {
		b := &pgx.Batch{}
		b.Queue("select pg_sleep(0.1)")
		done <- p.SendBatch(ctx, b).Close()
	}()
	time.Sleep(700 * time.Millisecond)
	c.Release()
	for i := 0; i < 2; i++ {
		if err := <-done; err != nil {
			t.Errorf("statement that waited for its connection: %v", err)
		}
	}
	rvIdle(t, p, "b")
}

// Pool.Close while statements wait for capacity and for a connection.
func TestPoolFrontCloseWhileWaiting(t *testing.T) {
	p := pendingPool(t, 1, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 30s}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 3)
	go func() { // admitted, waits for the connection
		_, err := p.Exec(ctx, "select 1")
		done <- err
	}()
	pendingEventually(t, "pending", func() bool { return p.Stat().EmptyAcquireCount() > 0 || poolBudget(t, p, "b").InFlight == 1 })
	time.Sleep(50 * time.Millisecond)
	go func() { // waits for capacity
		_, err := p.Exec(ctx, "select 2")
		done <- err
	}()
	pendingEventually(t, "waiting", func() bool { return poolBudget(t, p, "b").Waiting == 1 })
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case err := <-done:
		if !errors.Is(err, driver.ErrClosed) {
			t.Errorf("first to return: %T %v, want ErrClosed", err, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the capacity waiter still waits 10s after Close")
	}
	// As under pgxpool, the statement waiting for the held connection returns once it is released.
	_, err = c.Exec(ctx, "select 3")
	t.Logf("held after close: %v", err)
	c.Release()
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("the pending statement ran after Close")
		}
		t.Logf("pending: %T %v", err, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("the pending statement still waits 10s after the release")
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return once the connection was released")
	}
	b := poolBudget(t, p, "b")
	if b.InFlight != 0 || b.Waiting != 0 {
		t.Errorf("after close: %+v", b)
	}
}
