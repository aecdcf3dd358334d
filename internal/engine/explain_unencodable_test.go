package engine

import (
	"context"
	"testing"

	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// countingConn is an EXPLAIN that fails with err without reaching the server, counting calls.
type countingConn struct {
	err   error
	calls int
}

func (c *countingConn) Explain(context.Context, string, []any) (cost.Plan, error) {
	c.calls++
	return cost.Plan{}, c.err
}

func (c *countingConn) InTransaction() bool { return false }

// TestExplainUnencodableArgs: arguments that pgx sends but the untyped EXPLAIN cannot encode
// (a [16]byte uuid, a composite registered on the connection) fail the pattern's EXPLAIN
// before it is sent: the failure is counted, not tried again at every execution (the pattern
// runs on its history until the plan's TTL), and a statement of the pattern is then decided
// before it takes a pool connection, as any whose plan is known.
func TestExplainUnencodableArgs(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: b, mode: enforce, per_query_limit: 10s}
rules:
  - {budget: b, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	const q = "insert into ids (id) values ($1)"
	conn := &countingConn{err: cost.ErrUnencodable}
	for range 5 {
		x := new(Exec)
		sctx, err := e.Begin(ctx, x, conn, q, []any{[16]byte{1}})
		if err != nil {
			t.Fatalf("a statement whose EXPLAIN cannot encode its arguments: %v, want it sent", err)
		}
		x.Finish(sctx, nil)
	}
	if conn.calls != 1 {
		t.Errorf("the pattern's EXPLAIN was tried %d times in 5 statements, want 1", conn.calls)
	}
	if s := e.Stats(); s.ExplainFailures.Load() != 1 || s.ExplainCalls.Load() != 0 {
		t.Errorf("explain failures %d, calls %d; want 1 failure, no call sent", s.ExplainFailures.Load(), s.ExplainCalls.Load())
	}
	x := new(Exec)
	sctx, err := e.BeginBeforeConn(ctx, x, q, []any{[16]byte{2}})
	if err != nil {
		t.Fatalf("decided before a pool connection: %v, want admitted there", err)
	}
	x.Abandon(sctx, nil)
}
