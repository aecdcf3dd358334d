package integration

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestPerDroppedAndRestoredReleasesSlot: a deploy drops a budget's per and its
// rollback restores it while a statement admitted before both is still running. The README
// says a budget keeps its state (debt, in-flight counts) across reloads while its name stays,
// and that a slot is held only until Exec returns or the rows are closed. So once that
// statement's rows are closed the budget must show nothing in flight, and its one slot per
// value must be free again: a statement without the tenant tag (counted under the empty
// value) and one of the same tenant must both run.
//
// Today the drop folds the tenant's slot into the budget's unkeyed count, the rollback
// recreates the per-tenant table without it, and the statement's release looks its slot up
// under "t1", finds no state and gives nothing back: the unkeyed count keeps one statement in
// flight for ever, and with max_concurrent: 1 every statement without the tag is refused for
// concurrency from then on.
func TestPerDroppedAndRestoredReleasesSlot(t *testing.T) {
	cfg := func(per string) *driver.Config {
		return &driver.Config{
			Budgets: []driver.Budget{{Name: "b", Mode: driver.ModeEnforce, MaxConcurrent: new(1), Per: per}},
			Rules:   []driver.Rule{{Budget: "b", Match: map[string]string{"app": "x"}}},
		}
	}
	c, db := openRules(t, "{}")
	if err := c.SetConfig(cfg("tenant")); err != nil {
		t.Fatal(err)
	}
	t1 := tagging.With(context.Background(), "app", "x", "tenant", "t1")
	rows, err := db.QueryContext(t1, "select 1") // holds tenant t1's slot until closed
	if err != nil {
		t.Fatal(err)
	}
	if got := budgetStatus(t, c, "b").InFlight; got != 1 {
		t.Fatalf("in flight before the reloads: %d; want 1", got)
	}
	if err := c.SetConfig(cfg("")); err != nil { // the deploy
		t.Fatal(err)
	}
	if err := c.SetConfig(cfg("tenant")); err != nil { // its rollback
		t.Fatal(err)
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	if !eventually(5*time.Second, func() bool { return budgetStatus(t, c, "b").InFlight == 0 }) {
		t.Errorf("budget b shows %d in flight after its only statement closed its rows",
			budgetStatus(t, c, "b").InFlight)
	}
	for _, tenant := range []string{"", "t1"} { // "": no tenant tag, counted under the empty value
		ctx := tagging.With(context.Background(), "app", "x")
		if tenant != "" {
			ctx = t1
		}
		if _, err := db.ExecContext(ctx, "select 2"); err != nil {
			t.Errorf("tenant %q: refused with nothing in flight: %v", tenant, err)
		}
	}
}
