package engine

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// argPlanConn plans a statement by its first argument: a range scan of id < $1 costs ten planner
// units a row.
type argPlanConn struct{ calls int }

func (c *argPlanConn) Explain(ctx context.Context, query string, args []any) (cost.Plan, error) {
	c.calls++
	return cost.Plan{Cost: 10 * float64(args[0].(int))}, nil
}

func (*argPlanConn) InTransaction() bool { return false }

// TestVolatilePatternPricedByItsOwnPlan: under explain: auto a pattern whose cost swings with
// its arguments is explained per call once its cost is seen to vary, "cheap insurance" (the
// cost package's documentation) that prices each call by its own plan. Before that its
// statements were priced, and the pattern trained, by the plan cached from its first call's
// arguments: 1 row (10 units), while every other call read 10,000 rows in 100 ms. Those pairs
// taught a k of about 5 ms a unit, and the first call explained per call, 100,000 units of its
// own, was predicted at minutes and refused by a per_query_limit of 2 s. A pool statement
// decided before its connection, priced by the pattern's latest cached plan (another call's),
// must not teach such pairs either.
func TestVolatilePatternPricedByItsOwnPlan(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: b, mode: enforce, per_query_limit: 2s, explain: auto}
rules:
  - {budget: b, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	conn := &argPlanConn{}
	const q = "select count(*) from big where id < $1"
	took := func(rows int) time.Duration { return time.Duration(rows) * 10 * time.Microsecond }
	run := func(rows int) (*Exec, error) {
		x := new(Exec)
		if _, err := e.Begin(ctx, x, conn, q, []any{rows}); err != nil {
			return x, err
		}
		clk.Advance(took(rows))
		x.Finish(ctx, nil)
		return x, nil
	}
	// Priced by the first call's cached plan until the pattern is seen to vary (after five
	// calls), then each by its own.
	var last *Exec
	for i := range 20 {
		rows := 10_000
		switch {
		case i%2 == 0:
			rows = 1
		case i >= 10:
			rows = 100
		}
		x, err := run(rows)
		if err != nil {
			t.Fatalf("call %d (%d rows, %v on the server): %v; predicted %.3gs of plan cost %.0f",
				i, rows, took(rows), err, x.Predicted, x.PlanCost)
		}
		last = x
	}
	if conn.calls < 10 {
		t.Fatalf("%d EXPLAINs in 20 calls: the pattern was not seen to vary", conn.calls)
	}
	if last.Predicted < 0.5e-3 || last.Predicted > 2e-3 {
		t.Errorf("a call of 100 rows (1 ms), explained per call, predicted %.3gs, want within 0.5-2x of 1 ms", last.Predicted)
	}

	// Pool statements decided before their connections, priced by the latest cached plan
	// (another call's, of 100 rows), while they read 1 or 10,000 rows.
	for i := range 10 {
		rows := 10_000
		if i%2 == 1 {
			rows = 1
		}
		x := new(Exec)
		if _, err := e.BeginBeforeConn(ctx, x, q, []any{rows}); err != nil {
			t.Fatal(err)
		}
		if err := x.Acquired(ctx); err != nil {
			t.Fatal(err)
		}
		clk.Advance(took(rows))
		x.Finish(ctx, nil)
	}
	x, err := run(100)
	if err != nil {
		t.Fatal(err)
	}
	if x.Predicted < 0.5e-3 || x.Predicted > 2e-3 {
		t.Errorf("after pool statements priced by another call's plan, a call of 100 rows (1 ms) explained per call "+
			"predicted %.3gs, want within 0.5-2x of 1 ms", x.Predicted)
	}
}
