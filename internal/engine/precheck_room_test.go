package engine

import (
	"context"
	"errors"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestPrecheckRefusesWithoutRoom: a statement of the pool whose cost needs an EXPLAIN on a
// connection (a pattern not yet costed, under a cost budget) is refused before it takes one
// when its budget has no room for it whatever it costs: its one slot taken and no max_wait,
// as a batch is (precheckBatch). With a free slot it is sent for its EXPLAIN (ErrNeedConn),
// holding nothing.
func TestPrecheckRefusesWithoutRoom(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1, server_share: 1, burst_limit: 100s}
rules:
  - {budget: a, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	first, err := begin(e, ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	cold := new(Exec)
	_, err = e.BeginBeforeConn(ctx, cold, "select 2", nil)
	var d *Denial
	if !errors.As(err, &d) || d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("a new pattern with the budget's slot taken, before its connection: %v, want a refusal for concurrency", err)
	}
	first.Finish(ctx, nil)
	if _, err = e.BeginBeforeConn(ctx, cold, "select 2", nil); err != ErrNeedConn {
		t.Fatalf("with the slot free: %v, want ErrNeedConn", err)
	}
	if n := e.Budgets()[0].InFlight; n != 0 {
		t.Errorf("%d in flight after the check, want 0: a checked request is not taken", n)
	}
}
