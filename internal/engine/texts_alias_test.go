package engine

import (
	"context"
	"testing"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestSavedRouteOwnsItsRequests: a text's saved route keeps its own admission requests, not
// the Exec's scratch, which the Exec's next statement (another text, another budget) reuses,
// as a connection does. Were they shared, "select 1" would come back from the cache charged
// to budget b.
func TestSavedRouteOwnsItsRequests(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 10}
  - {name: b, mode: enforce, max_concurrent: 10}
rules:
  - {budget: a, match: {app: a}}
  - {budget: b, match: {app: b}}
`)
	ctxA := tagging.With(context.Background(), "app", "a")
	ctxB := tagging.With(context.Background(), "app", "b")
	x := new(Exec) // one connection's
	for range 20 {
		for _, s := range []struct {
			ctx context.Context
			q   string
		}{{ctxA, "select 1"}, {ctxB, "select 2"}} {
			if _, err := e.Begin(s.ctx, x, nil, s.q, nil); err != nil {
				t.Fatal(err)
			}
			x.Finish(s.ctx, nil)
		}
	}
	if _, err := e.Begin(ctxA, x, nil, "select 1", nil); err != nil {
		t.Fatal(err)
	}
	defer x.Finish(ctxA, nil)
	want := map[string][2]int{"a": {1, 21}, "b": {0, 20}} // in flight, admitted
	for _, b := range e.Budgets() {
		if w := want[b.Name]; b.InFlight != w[0] || b.Decisions.Admitted != uint64(w[1]) {
			t.Errorf("budget %s: %d in flight, %d admitted; want %d, %d", b.Name, b.InFlight, b.Decisions.Admitted, w[0], w[1])
		}
	}
}
