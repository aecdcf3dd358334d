package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// lockedConn is a connection whose EXPLAIN waits for its gate, as on a migration's lock, and
// then fails as the server cancels it at the session's lock_timeout, counting the calls.
type lockedConn struct {
	gate  chan struct{}
	calls *atomic.Int32
}

func (lockedConn) InTransaction() bool { return false }

func (c lockedConn) Explain(ctx context.Context, query string, args []any) (cost.Plan, error) {
	c.calls.Add(1)
	<-c.gate
	return cost.Plan{}, fmt.Errorf("canceling statement due to lock timeout: %w", cost.ErrCancelled)
}

// startWaiters begins n statements of q on conn in goroutines, each finished at once once
// admitted, and returns their outcomes, sent once each ends.
func startWaiters(e *Engine, ctx context.Context, conn Conn, q string, n int) <-chan error {
	out := make(chan error, n)
	for i := range n {
		go func() {
			x := new(Exec)
			_, err := e.Begin(ctx, x, conn, q, []any{i})
			if err == nil {
				x.Finish(ctx, nil)
			}
			out <- err
		}()
	}
	return out
}

// TestExplainCutOffNotExplainedInTurn: statements of a new pattern wait for its first EXPLAIN,
// which a migration's lock holds until the server cancels it (lock_timeout). They are not
// explained again in turn, each waiting for the same lock once more (twenty statements took
// twenty lock timeouts end to end): they fall back to the pattern's history, as a statement
// whose own EXPLAIN failed does, and run, meeting the lock, if it is still held, each under
// its own bounds, as without pgtraffic.
func TestExplainCutOffNotExplainedInTurn(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: b, mode: enforce, server_share: 1, burst_limit: 100s, explain: pattern}
rules:
  - {budget: b, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	const q = "select count(*) from orders where id = $1"
	calls := new(atomic.Int32)
	gate := make(chan struct{})
	conn := lockedConn{gate: gate, calls: calls}
	led := startWaiters(e, ctx, conn, q, 1)
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	const others = 4
	waiters := startWaiters(e, ctx, conn, q, others)
	time.Sleep(50 * time.Millisecond) // for the others to reach the wait
	close(gate)
	if err := <-led; !errors.Is(err, cost.ErrCancelled) {
		t.Errorf("the statement whose EXPLAIN the server cancelled: %v, want the server's error", err)
	}
	for range others {
		if err := <-waiters; err != nil {
			t.Errorf("a statement that waited for that EXPLAIN: %v, want it run", err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d EXPLAINs of the pattern, want 1: the statements waiting for it explained it again", n)
	}
}

// TestZeroLimitRefusesBeforeExplain: a statement of a new pattern in a budget closed by
// max_concurrent: 0 (a tenant shut off in an incident) is refused before its EXPLAIN: none is
// sent (it would wait on a migration's lock as long as the lock is held, holding its
// connection), nor waited for when another statement's is on its way.
func TestZeroLimitRefusesBeforeExplain(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: all, mode: enforce, server_share: 1, burst_limit: 100s, explain: pattern}
  - {name: off, mode: enforce, max_concurrent: 0, per: tenant}
rules:
  - {budget: all, match: {app: x}}
  - {budget: off, match: {app: x, tenant: "7"}}
`)
	open := tagging.With(context.Background(), "app", "x", "tenant", "1")
	shut := tagging.With(context.Background(), "app", "x", "tenant", "7")
	calls := new(atomic.Int32)
	gate := make(chan struct{})
	defer close(gate)
	conn := lockedConn{gate: gate, calls: calls}
	refusedAt := func(q string, arg int) {
		t.Helper()
		refused := make(chan error, 1)
		go func() {
			_, err := e.Begin(shut, new(Exec), conn, q, []any{arg})
			refused <- err
		}()
		select {
		case err := <-refused:
			var d *Denial
			if !errors.As(err, &d) {
				t.Errorf("a shut-off tenant's statement: %v, want refused", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a shut-off tenant's statement waited for an EXPLAIN held by a lock")
		}
	}
	refusedAt("select * from t1 where id = $1", 1)
	if n := calls.Load(); n != 0 {
		t.Errorf("%d EXPLAINs sent for a statement that a zero limit refuses, want 0", n)
	}
	const q = "select * from t2 where id = $1"
	_ = startWaiters(e, open, conn, q, 1) // its EXPLAIN waits on the lock until the test ends
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	refusedAt(q, 2) // while its pattern's EXPLAIN, another statement's, waits on the lock
}

// TestReloadReachesExplainWaiters: statements waiting for their pattern's EXPLAIN, held by a
// lock, are decided again at once when a reload closes their budget (max_concurrent: 0), as
// the statements waiting for room are, not when the lock is released.
func TestReloadReachesExplainWaiters(t *testing.T) {
	const base = `
budgets:
  - {name: b, mode: enforce, server_share: 1, burst_limit: 100s, explain: pattern%s}
rules:
  - {budget: b, match: {app: x}}
`
	e, _ := newEngine(t, fmt.Sprintf(base, ""))
	ctx := tagging.With(context.Background(), "app", "x")
	const q = "select count(*) from orders where id = $1"
	calls := new(atomic.Int32)
	gate := make(chan struct{})
	defer close(gate)
	conn := lockedConn{gate: gate, calls: calls}
	_ = startWaiters(e, ctx, conn, q, 1)
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	const others = 3
	waiters := startWaiters(e, ctx, conn, q, others)
	time.Sleep(50 * time.Millisecond) // for them to reach the wait
	reload(t, e, fmt.Sprintf(base, ", max_concurrent: 0"))
	var wg sync.WaitGroup
	for range others {
		wg.Go(func() {
			select {
			case err := <-waiters:
				var d *Denial
				if !errors.As(err, &d) {
					t.Errorf("a statement waiting for the EXPLAIN after its budget closed: %v, want refused", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("a statement waiting for an EXPLAIN held by a lock was not decided again at the reload")
			}
		})
	}
	wg.Wait()
}

// heldConn is a connection whose EXPLAIN waits on a lock until its context ends, counting the
// calls.
type heldConn struct{ calls *atomic.Int32 }

func (heldConn) InTransaction() bool { return false }

func (c heldConn) Explain(ctx context.Context, query string, args []any) (cost.Plan, error) {
	c.calls.Add(1)
	<-ctx.Done()
	return cost.Plan{}, fmt.Errorf("cost: explain failed: %w", ctx.Err())
}

// TestReloadCutsExplainOnItsWay: a statement whose own EXPLAIN waits on a migration's lock (under
// explain: call every statement sends one) is decided again at once when a reload blocks its
// pattern: its EXPLAIN is cut off and it is refused, rather than wait, holding its connection,
// until the lock goes.
func TestReloadCutsExplainOnItsWay(t *testing.T) {
	const base = `
budgets:
  - {name: b, mode: enforce, per_query_limit: 30s, explain: call%s}
rules:
  - {budget: b, match: {app: x}}
`
	e, _ := newEngine(t, fmt.Sprintf(base, ""))
	ctx := tagging.With(context.Background(), "app", "x")
	calls := new(atomic.Int32)
	out := startWaiters(e, ctx, heldConn{calls: calls}, "select count(*) from hot where id = $1", 1)
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	reload(t, e, fmt.Sprintf(base, ", max_concurrent: 0"))
	select {
	case err := <-out:
		var d *Denial
		if !errors.As(err, &d) {
			t.Errorf("a statement whose EXPLAIN was on its way when a reload closed its budget: %v, want refused", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a reload that closed its budget did not reach a statement whose EXPLAIN waits on a lock")
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d EXPLAINs, want 1: the statement decided again under the closed budget explains nothing", n)
	}
}
