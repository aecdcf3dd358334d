package engine

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestServerClockCharges: a statement is charged the client's measurement less the network's
// round trip, until the server reports its pattern; then it is charged its prediction, on the
// server's clock, until the report lapses.
func TestServerClockCharges(t *testing.T) {
	e, clk := newEngine(t, `
server_cores: 1
budgets:
  - {name: r, mode: enforce, server_share: 0.000001, burst_limit: 100s}
rules:
  - {budget: r, match: {app: r}}
`)
	ctx := tagging.With(context.Background(), "app", "r")
	const q = "select v from t where id = $1"
	debt := func() float64 {
		for _, b := range e.Budgets() {
			return b.Snapshot.Debt
		}
		return 0
	}
	charged := func(took time.Duration) float64 {
		t.Helper()
		before := debt()
		if err := run(e, clk, ctx, q, took); err != nil {
			t.Fatal(err)
		}
		return debt() - before
	}
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-3 }

	if got := charged(300 * time.Millisecond); !near(got, 0.3) {
		t.Fatalf("client clock: charged %v, want 0.3", got)
	}
	e.SetNetworkFloor(100 * time.Millisecond)
	if got := charged(300 * time.Millisecond); !near(got, 0.2) {
		t.Fatalf("client clock less a 100ms round trip: charged %v, want 0.2", got)
	}
	p, _ := e.patterns.Get(q)
	fp := p.FingerprintID
	if e.ObserveServer(fp, 42, 0.01, clk.Now().Add(time.Minute)) {
		t.Fatal("a report for a query identifier the pattern does not have was taken")
	}
	e.model.PutQueryID(fp, 42)
	if ids := e.QueryIDs(nil, 10); len(ids) != 1 || ids[0].Fingerprint != fp || ids[0].ID != 42 {
		t.Fatalf("QueryIDs = %+v", ids)
	}
	if !e.ObserveServer(fp, 42, 0.01, clk.Now().Add(time.Minute)) {
		t.Fatal("the server's report was not taken")
	}
	if got := charged(300 * time.Millisecond); !near(got, 0.01) {
		t.Fatalf("server clock: charged %v, want the server's 0.01", got)
	}
	if top := e.TopPatterns(1); len(top) != 1 || !top[0].Server || top[0].ServerMean != 0.01 {
		t.Fatalf("TopPatterns = %+v, want the server's clock", top)
	}
	clk.Advance(time.Minute)
	if got := charged(300 * time.Millisecond); near(got, 0.01) {
		t.Fatalf("after the report lapsed: charged %v, want the client's clock again", got)
	}
}
