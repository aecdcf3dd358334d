package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// gatedConn is a connection whose EXPLAIN waits for its gate, counting the calls.
type gatedConn struct {
	gate  chan struct{}
	calls *atomic.Int32
	inTx  bool // inside a transaction block
}

func (c gatedConn) InTransaction() bool { return c.inTx }

func (c gatedConn) Explain(ctx context.Context, query string, args []any) (cost.Plan, error) {
	c.calls.Add(1)
	<-c.gate
	return cost.Plan{Cost: 10}, nil
}

// TestNewPatternExplainedOnce: statements of a new pattern that come while its first EXPLAIN is
// on its way (a deploy: one handler in many goroutines, each on its own connection) wait for it
// and are priced by its plan: one EXPLAIN for the pattern, not one per connection. A pool
// statement that has no connection yet waits too, and needs none once the plan is cached.
func TestNewPatternExplainedOnce(t *testing.T) {
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
	lead := new(Exec)
	led := make(chan error, 1)
	go func() {
		_, err := e.Begin(ctx, lead, gatedConn{gate: gate, calls: calls}, q, []any{1})
		led <- err
	}()
	for calls.Load() == 0 { // until the first statement's EXPLAIN is on its way
		time.Sleep(time.Millisecond)
	}
	const others = 4
	var wg sync.WaitGroup
	errs := make(chan error, others+1)
	for i := range others {
		wg.Go(func() {
			x := new(Exec)
			if _, err := e.Begin(ctx, x, gatedConn{gate: gate, calls: calls}, q, []any{i}); err != nil {
				errs <- err
				return
			}
			x.Finish(ctx, nil)
		})
	}
	wg.Go(func() {
		x := new(Exec)
		if _, err := e.BeginBeforeConn(ctx, x, q, []any{9}); err != nil {
			errs <- err // ErrNeedConn: it would take a connection to explain again
			return
		}
		if err := x.Acquired(ctx); err != nil {
			errs <- err
			return
		}
		x.Finish(ctx, nil)
	})
	// Time for the others to reach their pricing: without the wait for the first EXPLAIN, each
	// sends its own meanwhile.
	for deadline := time.Now().Add(200 * time.Millisecond); time.Now().Before(deadline) && calls.Load() == 1; {
		time.Sleep(time.Millisecond)
	}
	close(gate)
	if err := <-led; err != nil {
		t.Fatal(err)
	}
	lead.Finish(ctx, nil)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a statement of the pattern: %v", err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d EXPLAINs of one new pattern, want 1", n)
	}
}

// TestStatementInTransactionDoesNotWaitForAnotherExplain: a transaction that holds a lock (a
// migration's LOCK TABLE) runs a statement of a pattern whose EXPLAIN another session has on
// its way, waiting for that very lock: the transaction's statement EXPLAINs on its own
// connection and runs, rather than wait for that EXPLAIN, which would wait for ever on the
// lock the waiting transaction holds.
func TestStatementInTransactionDoesNotWaitForAnotherExplain(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: b, mode: enforce, server_share: 1, burst_limit: 100s, explain: pattern}
rules:
  - {budget: b, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	const q = "select count(*) from orders where id > $1"
	calls := new(atomic.Int32)
	blocked := make(chan struct{}) // the other session's EXPLAIN waits on the lock until the end
	defer close(blocked)
	go func() {
		x := new(Exec)
		if _, err := e.Begin(ctx, x, gatedConn{gate: blocked, calls: calls}, q, []any{1}); err == nil {
			x.Finish(ctx, nil)
		}
	}()
	for calls.Load() == 0 { // until the other session's EXPLAIN is on its way
		time.Sleep(time.Millisecond)
	}
	open := make(chan struct{})
	close(open)
	done := make(chan error, 1)
	go func() {
		x := new(Exec)
		_, err := e.Begin(ctx, x, gatedConn{gate: open, calls: calls, inTx: true}, q, []any{2})
		if err == nil {
			x.Finish(ctx, nil)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second): // a watchdog only
		t.Fatal("the transaction's statement waits for another session's EXPLAIN, which waits for its lock")
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("%d EXPLAINs, want 2: the transaction's own", n)
	}
}
