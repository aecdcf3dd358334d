package engine

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestEveryWarnBoundCounts: warn mode exists so that a limit can be watched
// before it is enforced (driver package doc: "Budgets are in warn mode unless they say
// otherwise, so that new limits can be watched before they are enforced"), and the rules doc
// says of max_duration "a warn budget only warns". A statement that ran 300ms under two warn
// budgets whose max_duration are 100ms and 200ms ran past both: each budget's status and the
// decisions metric must count it as that budget's warning, reason max_duration (BudgetStatus:
// "A statement that ran past the budget's max_duration counts a second decision ... Warned when
// warn mode let it run"). Switched to enforce, either budget would have cancelled it.
//
// Were only the smaller warn bound kept, the other budget's dry run would show no overrun at
// all: an operator watching it before enforcing it would see a clean budget that, once
// enforced, cancels these statements.
func TestEveryWarnBoundCounts(t *testing.T) {
	obs := &recObserver{}
	e, clk := newEngine(t, `
budgets:
  - {name: team, mode: warn, max_duration: 100ms}
  - {name: reports, mode: warn, max_duration: 200ms}
rules:
  - {budget: team, match: {app: r}}
  - {budget: reports, match: {app: r}}
`, func(o *Options) { o.Observer = obs })
	ctx := tagging.With(context.Background(), "app", "r")
	x, err := begin(e, ctx, "select pg_sleep(5)")
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(300 * time.Millisecond)
	x.Finish(ctx, nil)
	for _, want := range []string{"team/warn/max_duration", "reports/warn/max_duration"} {
		if n := countOf(obs.decisions, want); n != 1 {
			t.Errorf("decision %s counted %d times, want 1 (the statement ran 300ms, past both warn budgets' max_duration); decisions %v",
				want, n, obs.decisions)
		}
	}
}
