package integration

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestZeroLimitsBlockWhatTheyMatch: max_concurrent: 0 and server_share: 0 refuse every statement
// their rules match, before it is sent, and nothing else; an omitted limit is unlimited.
func TestZeroLimitsBlockWhatTheyMatch(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: closed, mode: enforce, max_concurrent: 0}
  - {name: dry, mode: enforce, server_share: 0}
  - {name: open, mode: enforce, per_query_limit: 10s}
rules:
  - {budget: closed, match: {tenant: noisy}}
  - {budget: dry, match: {controller: export}}
  - {budget: open, match: {app: shop}}
`)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "create table hits (n int)"); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		tags           []string
		budget, reason string
	}{
		{[]string{"tenant", "noisy", "app", "shop"}, "closed", driver.ReasonConcurrency},
		{[]string{"controller", "export"}, "dry", driver.ReasonBudget},
	} {
		_, err := db.ExecContext(tagging.With(ctx, tt.tags...), "insert into hits values (1)")
		be := asBlocked(t, err)
		if be.Budget != tt.budget || be.Reason != tt.reason || be.RetryAfter != 0 {
			t.Errorf("%v: %+v", tt.tags, be)
		}
	}
	for _, tags := range [][]string{{"tenant", "quiet", "app", "shop"}, {"controller", "checkout"}, {}} {
		if _, err := db.ExecContext(tagging.With(ctx, tags...), "insert into hits values (2)"); err != nil {
			t.Errorf("%v: %v", tags, err)
		}
	}
	var ones, twos int
	if err := db.QueryRowContext(ctx, "select count(*) filter (where n = 1), count(*) filter (where n = 2) from hits").Scan(&ones, &twos); err != nil {
		t.Fatal(err)
	}
	if ones != 0 || twos != 3 {
		t.Errorf("rows inserted: %d refused ones, %d admitted twos; want 0 and 3", ones, twos)
	}
	if b := budgetStatus(t, c, "closed"); b.Blocked != 1 {
		t.Errorf("closed: blocked %d, want 1", b.Blocked)
	}
}

// TestRuleUntilLapsesWithoutReload: a rule whose until is two seconds ahead blocks, then stops
// blocking with no reload; one whose until has passed never applies.
func TestRuleUntilLapsesWithoutReload(t *testing.T) {
	until := time.Now().Add(2 * time.Second).UTC().Format(time.RFC3339Nano)
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	c, db := openRules(t, `
budgets:
  - {name: block, mode: enforce, max_concurrent: 0}
rules:
  - {budget: block, match: {tenant: noisy}, until: "`+until+`"}
  - {budget: block, match: {tenant: old}, until: "`+past+`"}
`)
	ctx := context.Background()
	noisy := tagging.With(ctx, "tenant", "noisy")
	if _, err := db.ExecContext(tagging.With(ctx, "tenant", "old"), "select 1"); err != nil {
		t.Fatalf("a lapsed rule applied: %v", err)
	}
	if _, err := db.ExecContext(noisy, "select 1"); asBlocked(t, err).Budget != "block" {
		t.Fatalf("not blocked by the rule: %v", err)
	}
	reloads := c.Snapshot().Counters.Reloads
	if !eventually(5*time.Second, func() bool {
		_, err := db.ExecContext(noisy, "select 1")
		return err == nil
	}) {
		t.Fatal("the rule still blocks after its until")
	}
	if n := c.Snapshot().Counters.Reloads; n != reloads {
		t.Fatalf("reloads: %d, then %d", reloads, n)
	}
}
