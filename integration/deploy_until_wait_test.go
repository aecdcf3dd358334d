package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestUntilLapsesForWaiters: the incident runbook in driver/rules throttles with a
// rule that has an until: "let until pass: the rule then selects nothing, with no reload". A
// statement that was waiting (max_wait) for the budget's only slot when the until passes is
// selected by nothing from then on, so it must run, as a reload that removed the rule would
// have let it run at once (README: new rules reach the statements already waiting).
//
// The slot is held by open rows for the whole test and max_wait is 60s. The rule lapses a few
// seconds after the waiter starts waiting; the waiter is given 20s more. Today it is never decided
// again: it keeps waiting under the lapsed rule until its max_wait ends, and is then refused
// by a budget no rule selects it for.
func TestUntilLapsesForWaiters(t *testing.T) {
	until := time.Now().Add(4 * time.Second).UTC().Truncate(time.Second).Add(time.Second)
	c, db := openRules(t, fmt.Sprintf(`
budgets:
  - {name: incident, mode: enforce, max_concurrent: 1, max_wait: 60s}
rules:
  - {budget: incident, match: {tenant: noisy}, until: %s}
`, until.Format(time.RFC3339)))
	db.SetMaxOpenConns(4)
	ctx := tagging.With(context.Background(), "tenant", "noisy")
	rows, err := db.QueryContext(ctx, "select 1") // holds the only slot until closed
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	done := make(chan error, 1)
	go func() { _, err := db.ExecContext(ctx, "select 2"); done <- err }()
	if !eventually(10*time.Second, func() bool { return budgetStatus(t, c, "incident").Waiting == 1 }) {
		t.Fatal("the second statement does not wait for the slot")
	}
	if time.Now().After(until) {
		t.Fatal("the rule lapsed before the statement waited; the machine is too slow for this setup")
	}
	time.Sleep(time.Until(until))
	// A fresh statement is no longer selected: the rule has lapsed.
	if _, err := db.ExecContext(ctx, "select 3"); err != nil {
		t.Fatalf("a new statement after the until: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the statement waiting when its only rule lapsed was refused: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the statement waiting when its only rule lapsed still waits 20s later (%d waiting): "+
			"it is held by a rule that selects nothing", budgetStatus(t, c, "incident").Waiting)
	}
}
