package engine

import (
	"context"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestGuardWarnCountedOncePerStatement: README's rollout guide says a warn-mode check
// counts what enforce would block in pgtraffic.decisions{pgtraffic.decision="warn"}, and the
// status page's recent refusals count it too: one statement a guard warns about is one warning.
// On driver.NewPool a statement is decided before it has a connection (BeginBeforeConn); when
// its budget needs an EXPLAIN (a pattern not costed yet, or explain: call) that returns
// ErrNeedConn and the pool decides the same statement again on its connection (Begin). The
// guard runs in both passes, so each such statement is counted, logged and reported to the
// observer as two guard warnings: during a warn rollout the counts a user reads to decide
// whether to enforce overstate the writes the guard would refuse.
func TestGuardWarnCountedOncePerStatement(t *testing.T) {
	obs := &recObserver{}
	e, _ := newEngine(t, `
budgets:
  - {name: b, mode: enforce, server_share: 0.5, explain: call}
rules:
  - {budget: b, match: {app: x}}
guards:
  require_where: warn
`, func(o *Options) { o.Observer = obs })
	ctx := tagging.With(context.Background(), "app", "x")
	const q = "update t set a = 1" // no WHERE: the guard warns, the statement runs
	x := new(Exec)
	if _, err := e.BeginBeforeConn(ctx, x, q, nil); err != ErrNeedConn {
		t.Fatalf("BeginBeforeConn: %v, want ErrNeedConn (the budget needs an EXPLAIN on a connection)", err)
	}
	// As the pool does after ErrNeedConn: it takes a connection and decides the statement there.
	sctx, err := e.Begin(ctx, x, &plannedConn{plan: 10}, q, nil)
	if err != nil {
		t.Fatalf("Begin on the connection: %v", err)
	}
	x.Finish(sctx, nil)

	guardWarns := 0
	for _, d := range obs.decisions {
		if d == vocab.GuardRequireWhere+"/warn/guard" {
			guardWarns++
		}
	}
	if guardWarns != 1 {
		t.Errorf("observer decisions %v: %d guard warnings for one statement, want 1", obs.decisions, guardWarns)
	}
	if n := e.Stats().Warned.Load(); n != 1 {
		t.Errorf("Stats().Warned = %d for one statement the guard warned about, want 1", n)
	}
	for _, r := range e.RecentBlocks() {
		if r.Budget == vocab.GuardRequireWhere && r.Count != 1 {
			t.Errorf("recent refusals: %s %s counted %d times for one statement, want 1", r.Budget, r.Decision, r.Count)
		}
	}
}
