package integration

import (
	"context"
	"testing"

	pgtdriver "github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

func setRulesOn(t *testing.T, c *pgtdriver.Connector, rules string) {
	t.Helper()
	cfg, err := pgtdriver.ParseConfig([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
}

// Slots held by open rows (of a prepared statement too) survive reloads that lower, remove and
// re-add the budget: never admitted above max_concurrent, and every slot comes back.
func TestSQLReloadWithOpenRows(t *testing.T) {
	two := `
budgets:
  - {name: b, mode: enforce, max_concurrent: 2}
rules:
  - {budget: b, match: {app: x}}
`
	one := `
budgets:
  - {name: b, mode: enforce, max_concurrent: 1}
rules:
  - {budget: b, match: {app: x}}
`
	none := `
budgets:
  - {name: other, mode: enforce, max_concurrent: 1}
rules:
  - {budget: other, match: {app: y}}
`
	c, db := openRules(t, two)
	ctx := tagging.With(context.Background(), "app", "x")
	st, err := db.PrepareContext(ctx, "select g from generate_series(1, $1::int) g")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r1, err := st.QueryContext(ctx, 100000)
	if err != nil {
		t.Fatal(err)
	}
	r1.Next()
	r2, err := db.QueryContext(ctx, "select g from generate_series(1, 100000) g")
	if err != nil {
		t.Fatal(err)
	}
	r2.Next()
	setRulesOn(t, c, one)
	setRulesOn(t, c, none)
	setRulesOn(t, c, one)
	if b := budgetStatus(t, c, "b"); b.InFlight != 2 {
		t.Fatalf("after reloads: %+v", b)
	}
	r1.Close()
	_, err = db.ExecContext(ctx, "select 1")
	asBlocked(t, err) // 1 in flight, max 1
	r2.Close()
	if _, err := db.ExecContext(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	setRulesOn(t, c, two)
	if b := budgetStatus(t, c, "b"); b.InFlight != 0 {
		t.Fatalf("end: %+v", b)
	}
}
