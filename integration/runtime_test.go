package integration

import (
	"context"
	"testing"

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
