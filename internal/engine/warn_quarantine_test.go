package engine

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestWarnQuarantineWarns: the README's rollout ("Add the budget in mode: warn
// ... Nothing is blocked; what enforce would block is logged, counted in
// pgtraffic.decisions{pgtraffic.decision="warn"} and marked with a pgtraffic.warn span event")
// and the rules doc ("a warn budget counts the overruns but refuses nothing") make a warn
// budget's quarantine its dry run: once the pattern is quarantined (the status lists it), each
// of its statements is one enforce would refuse with reason quarantine, so it must run with a
// warning of that budget, reason quarantine, as a warn budget warns for its zero limits, its
// health thresholds and its other limits.
//
// Were the warn budget's quarantine only listed, its statements running as plain allows, the
// dry run would show nothing of what enforce would refuse, and since the switch to enforce
// keeps the budget's quarantines (a reload changing the mode keeps them), the first statements
// after the switch would be refused without one warning having been seen.
func TestWarnQuarantineWarns(t *testing.T) {
	obs := &recObserver{}
	e, clk := newEngine(t, `
budgets:
  - {name: dry, mode: warn, max_duration: 100ms, quarantine: {after: 1, for: 1m}}
rules:
  - {budget: dry, match: {app: r}}
`, func(o *Options) { o.Observer = obs })
	ctx := tagging.With(context.Background(), "app", "r")
	const slow = "select pg_sleep(5)"
	if err := run(e, clk, ctx, slow, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if q := e.Quarantines(); len(q) != 1 || q[0].Budget != "dry" {
		t.Fatalf("quarantines after a run past the warn budget's max_duration with after: 1: %+v", q)
	}
	x, err := begin(e, ctx, slow)
	if err != nil {
		t.Fatalf("a warn budget refused: %v", err)
	}
	defer x.Finish(ctx, nil)
	if x.Decision != DecisionWarn || x.Reason != vocab.ReasonQuarantine {
		t.Errorf("statement of a pattern the warn budget has quarantined: decision %q reason %q, want warn/quarantine (what enforce would refuse); decisions %v",
			x.Decision, x.Reason, obs.decisions)
	}
	if n := countOf(obs.decisions, "dry/warn/quarantine"); n != 1 {
		t.Errorf("dry/warn/quarantine counted %d times, want 1; decisions %v", n, obs.decisions)
	}
}
