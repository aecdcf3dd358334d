package integration

import (
	"context"
	"testing"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// rules.Quarantine: "a warn budget counts the overruns but refuses nothing", an overrun being a
// run past max_duration or a measured cost above per_query_limit. A warn budget's quarantine is
// its dry run: the status should show the same pattern quarantined whichever of the two it
// overran, and nothing is refused.
func TestOverrunWarnQuarantineCounts(t *testing.T) {
	for _, tt := range []struct{ name, limit string }{
		{"per_query_limit", "per_query_limit: 100ms"},
		{"max_duration", "max_duration: 100ms"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, db := openRules(t, `
budgets:
  - {name: dry, mode: warn, `+tt.limit+`, quarantine: {after: 1, for: 30s}}
rules:
  - {budget: dry, match: {app: reports}}
`)
			ctx := tagging.With(context.Background(), "app", "reports")
			for i := range 2 {
				if _, err := db.ExecContext(ctx, "select pg_sleep(0.3)"); err != nil {
					t.Fatalf("run %d of a warn budget's statement: %v", i, err)
				}
			}
			b := budgetStatus(t, c, "dry")
			qs := c.Snapshot().Quarantines
			t.Logf("warned %v, blocked %v, quarantines %+v", b.WarnedBy, b.BlockedBy, qs)
			if b.Blocked != 0 {
				t.Errorf("a warn budget blocked %v", b.BlockedBy)
			}
			if len(qs) != 1 {
				t.Errorf("%s: %d quarantines listed after two overruns under after: 1, want 1 (counted, not refused)", tt.name, len(qs))
			}
		})
	}
}
