package engine

import (
	"context"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestQuarantineTiedBound: a statement selected by two enforce budgets with the
// same max_duration, only the second of which has a quarantine, is cut at that bound: it ran
// past the max_duration of both budgets. The rules doc says a quarantine counts the pattern's
// statements that "overran the budget's max_duration" (driver/rules Quarantine; design.md
// section 3: "a pattern that overran max_duration ... N times within D is refused for D"), so
// the budget with the quarantine must count it: with after: 1 the pattern is quarantined.
//
// Were only the budget that max_duration is attributed to (the first rule on a tie) to count the
// strike, a quarantine on a budget whose max_duration ties with a catch-all budget's (a
// common setup: a default 30s everywhere, and the same 30s with a quarantine for reports) never
// quarantines anything, whatever the pattern does.
func TestQuarantineTiedBound(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: everything, mode: enforce, max_duration: 300ms}
  - {name: reports, mode: enforce, max_duration: 300ms, quarantine: {after: 1, for: 1m}}
rules:
  - {budget: everything, match: {app: r}}
  - {budget: reports, match: {app: r}}
`)
	ctx := tagging.With(context.Background(), "app", "r")
	const slow = "select pg_sleep(5)"
	overrun(t, e, clk, ctx, slow)
	err := run(e, clk, ctx, slow, 0)
	if err == nil {
		t.Fatalf("the pattern ran past reports' max_duration (300ms) once, with quarantine {after: 1}, "+
			"and is not quarantined: quarantines %+v", e.Quarantines())
	}
	if d := denial(t, err); d.Reason != vocab.ReasonQuarantine || d.Budget != "reports" {
		t.Fatalf("denial %+v, want reports' quarantine", d)
	}
}
