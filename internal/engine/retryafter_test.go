package engine

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestRetryAfterExact: a statement of a known pattern refused by the bucket is
// admitted when retried RetryAfter later, absent other traffic.
func TestRetryAfterExact(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: b, mode: enforce, server_share: 0.5, burst_limit: 2s, per_query_limit: 2s}
rules:
  - {budget: b, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	conn := &plannedConn{plan: 1000}
	const q = "select * from t where v = $1"
	try := func() (*Exec, error) {
		x := new(Exec)
		if _, err := e.Begin(ctx, x, conn, q, []any{1}); err != nil {
			return nil, err
		}
		return x, nil
	}
	for i := 0; i < 40; i++ {
		x, err := try()
		if err != nil {
			d := denial(t, err)
			if d.RetryAfter <= 0 {
				t.Fatalf("round %d: %+v", i, d)
			}
			clk.Advance(d.RetryAfter)
			if x, err = try(); err != nil {
				t.Fatalf("round %d: retried after %v, still refused: %v", i, d.RetryAfter, err)
			}
		}
		clk.Advance(time.Duration(300+i*37) * time.Millisecond)
		x.Finish(ctx, nil)
	}
}
