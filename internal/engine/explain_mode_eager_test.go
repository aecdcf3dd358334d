package engine

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestExplainMostEagerModeWins: driver/rules documents Budget.Explain as "pattern, once
// per pattern (and again after a minute); call, for every execution; auto (the default), per
// pattern, but per call for patterns whose cost varies widely. With several budgets the most
// eager wins." auto explains at least as often as pattern (the same per-pattern cache, plus a
// per-call EXPLAIN for volatile patterns), so a statement selected by an auto budget and a
// pattern budget must be explained as auto says. The engine orders the modes auto < pattern <
// call (compile.go) and takes the max (decide.go route): the pattern budget silences the auto
// budget's per-call EXPLAIN, and the volatile pattern is priced by a stale plan cost.
func TestExplainMostEagerModeWins(t *testing.T) {
	const q = "select * from big where id < $1"
	explains := func(t *testing.T, rulesText string) int {
		e, clk := newEngine(t, rulesText)
		ctx := tagging.With(context.Background(), "app", "x")
		conn := &plannedConn{plan: 1000}
		runOne := func(d time.Duration) {
			x := new(Exec)
			if _, err := e.Begin(ctx, x, conn, q, []any{1}); err != nil {
				t.Fatal(err)
			}
			clk.Advance(d)
			x.Finish(ctx, nil)
		}
		// A pattern whose cost swings with its arguments: 1 ms, 200 ms, 1 ms, 200 ms, ...
		for i := range 10 {
			runOne(time.Duration(1+199*(i%2)) * time.Millisecond)
		}
		before := conn.calls
		for range 4 {
			runOne(100 * time.Millisecond)
		}
		return conn.calls - before
	}
	auto := explains(t, `
budgets:
  - {name: a, mode: warn, server_share: 1, burst_limit: 100s, explain: auto}
rules:
  - {budget: a, match: {app: x}}
`)
	if auto != 4 {
		t.Fatalf("control: an auto budget alone explained the volatile pattern %d times in 4 calls, want 4", auto)
	}
	both := explains(t, `
budgets:
  - {name: a, mode: warn, server_share: 1, burst_limit: 100s, explain: auto}
  - {name: p, mode: warn, server_share: 1, burst_limit: 100s, explain: pattern}
rules:
  - {budget: a, match: {app: x}}
  - {budget: p, match: {app: x}}
`)
	if both != auto {
		t.Errorf("selected by an auto and a pattern budget, the volatile pattern was explained %d times in 4 calls; "+
			"auto alone explains it %d times: the most eager mode (auto) must win", both, auto)
	}
}
