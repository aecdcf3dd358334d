package engine

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// coldRules hold budgets that match every statement of the test engine (database shop):
// two generous ones, a tight one, and the default burst with a share below 1 with and without
// max_wait.
const coldRules = `
budgets:
  - {name: generous, mode: enforce, max_concurrent: 100, server_share: 1, burst_limit: 10s}
  - {name: plain, mode: enforce, server_share: 1}
  - {name: tight, mode: enforce, server_share: 0.5}
  - {name: waits, mode: enforce, server_share: 0.5, max_wait: 5s}
rules:
  - {budget: generous, match: {database: shop, app: generous}}
  - {budget: plain, match: {database: shop, app: plain}}
  - {budget: tight, match: {database: shop, app: tight}}
  - {budget: waits, match: {database: shop, app: waits}}
`

// beginAsync begins q on another goroutine; the channel receives its Exec or error.
type begun struct {
	x   *Exec
	err error
}

func beginAsync(e *Engine, ctx context.Context, q string) <-chan begun {
	ch := make(chan begun, 1)
	go func() {
		x, err := begin(e, ctx, q)
		ch <- begun{x, err}
	}()
	return ch
}

// budgetNamed returns the named budget's state in the rules in force.
func budgetNamed(t *testing.T, e *Engine, name string) *budgetState {
	t.Helper()
	for _, bs := range e.state.Load().budgets {
		if bs.name == name {
			return bs
		}
	}
	t.Fatalf("no budget %q", name)
	return nil
}

// TestColdStartGenerousBudgetRefusesNothing reproduces a deploy: 16 requests at once, each
// running 12 statements of patterns the process has never seen, under a generous enforce
// budget; and pgx's TestConnConcurrency's 50 at once under a budget of share 1 with the
// default burst, which their known costs never fill. None is refused; each statement's
// reservation is trued up to its actual time.
func TestColdStartGenerousBudgetRefusesNothing(t *testing.T) {
	for _, c := range []struct {
		app                string
		requests, patterns int
		took               time.Duration
	}{{"generous", 16, 12, 20 * time.Millisecond}, {"plain", 50, 3, time.Millisecond}} {
		t.Run(c.app, func(t *testing.T) {
			e, clk := newEngine(t, coldRules)
			ctx := tagging.With(context.Background(), "app", c.app)
			for j := range c.patterns {
				q := fmt.Sprintf("select * from cold_%d where id = $1", j)
				xs := make([]*Exec, 0, c.requests)
				for r := range c.requests { // every request's j-th statement in flight at once
					x, err := begin(e, ctx, q)
					if err != nil {
						t.Fatalf("request %d, pattern %d refused at a cold start: %v", r, j, err)
					}
					xs = append(xs, x)
				}
				clk.Advance(c.took)
				for _, x := range xs {
					x.Finish(ctx, nil)
				}
			}
			// Trued up: the debt is what ran, less what drained while each batch ran (share 1;
			// the batches follow one another at once).
			snap := budgetNamed(t, e, c.app).b.Snapshot(clk.Now())
			if snap.InFlight != 0 || snap.Decisions.Blocked != 0 || snap.Decisions.Admitted != uint64(c.requests*c.patterns) {
				t.Fatalf("budget after the cold start: %+v", snap)
			}
			want := float64(c.patterns*(c.requests-1)) * c.took.Seconds()
			if math.Abs(snap.Debt-want) > 1e-9 {
				t.Fatalf("debt %v after the cold start, want %v (the actual time, trued up)", snap.Debt, want)
			}
		})
	}
}

// TestColdStartTightBudgetWaitsForRoom: under a tight budget statements of an unknown cost
// run while their conservative reservation fits, and the rest are refused as when credit is
// short (reason budget, a positive RetryAfter), never as a cost that can never fit.
func TestColdStartTightBudgetWaitsForRoom(t *testing.T) {
	e, _ := newEngine(t, coldRules)
	ctx := tagging.With(context.Background(), "app", "tight")
	const q = "select pg_sleep(10)"
	admitted := 0
	for range 150 {
		x, err := begin(e, ctx, q)
		if err == nil {
			admitted++
			defer x.Finish(ctx, nil)
			continue
		}
		if d := denial(t, err); d.Reason != vocab.ReasonBudget || d.RetryAfter <= 0 {
			t.Fatalf("a statement of unknown cost refused with %+v, want reason budget and a RetryAfter", d)
		}
	}
	if admitted < 2 || admitted == 150 {
		t.Fatalf("%d of 150 admitted, want several, within the burst", admitted)
	}
}

// TestHungFirstStatementDoesNotSayNeverFits: statements of a pattern whose first statement
// hangs are not told, once it has run burst ÷ rate, that they can never fit (reason
// per_query_limit, RetryAfter 0): their cost is only unknown.
func TestHungFirstStatementDoesNotSayNeverFits(t *testing.T) {
	e, clk := newEngine(t, coldRules)
	ctx := tagging.With(context.Background(), "app", "waits")
	const q = "select pg_sleep(100)"
	hung, err := begin(e, ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Finish(ctx, nil)
	ch := beginAsync(e, ctx, q)
	var b begun
	select {
	case b = <-ch:
	case <-clk.Set(): // it waits for the first one
		clk.Advance(time.Second) // burst ÷ rate: 0.5 ÷ 0.5
		b = <-ch
	}
	if b.err != nil {
		if d := denial(t, b.err); d.Reason != vocab.ReasonBudget || d.RetryAfter <= 0 {
			t.Fatalf("behind a hung first statement: %+v, want admitted or reason budget with a RetryAfter", d)
		}
		return
	}
	b.x.Finish(ctx, nil)
}
