package engine

import (
	"context"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// plannedConn is an EXPLAIN that reports a fixed planner cost and no query identifier (as a
// server without compute_query_id does).
type plannedConn struct {
	plan  float64
	id    int64
	calls int
}

func (c *plannedConn) Explain(ctx context.Context, query string, args []any) (cost.Plan, error) {
	c.calls++
	return cost.Plan{Cost: c.plan, QueryID: c.id}, nil
}

// TestExplainCallPatternIsProbed: under `explain: call`, a new pattern whose planner
// guess exceeds per_query_limit is refused; README promises that once refused for 10 s as too
// costly, one statement runs as a probe, under explain: call as under pattern (a pattern the
// cost model did not hold yet was never counted as refused, and never probed).
func TestExplainCallPatternIsProbed(t *testing.T) {
	for _, mode := range []string{"call", "pattern"} {
		t.Run(mode, func(t *testing.T) {
			e, clk := newEngine(t, `
budgets:
  - {name: b, mode: enforce, per_query_limit: 1s, explain: `+mode+`}
rules:
  - {budget: b, match: {app: x}}
`)
			ctx := tagging.With(context.Background(), "app", "x")
			// 1e7 planner units × the default k 3.5e-6 = 35 s predicted: refused.
			conn := &plannedConn{plan: 1e7}
			const q = "select * from big where id = $1"
			try := func() (*Exec, error) {
				x := new(Exec)
				_, err := e.Begin(ctx, x, conn, q, []any{1})
				if err != nil {
					return nil, err
				}
				return x, nil
			}
			if _, err := try(); err == nil || denial(t, err).Reason != vocab.ReasonPerQuery {
				t.Fatalf("first: %v, want per_query_limit", err)
			}
			probed := false
			for i := 0; i < 6 && !probed; i++ {
				clk.Advance(cost.Relearn)
				x, err := try()
				if err == nil {
					probed = x.probe
					x.Finish(ctx, nil)
				}
			}
			if !probed {
				t.Fatalf("explain %s: pattern refused for %v with no probe (probes counted %d); README: one probe every 10 s",
					mode, 6*cost.Relearn, e.Stats().Probes.Load())
			}
		})
	}
}

func (*plannedConn) InTransaction() bool { return false }
