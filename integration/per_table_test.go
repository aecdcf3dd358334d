package integration

import (
	"context"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
)

// TestPerTableSpellingSharesTheSlot: a budget per: table with one slot per table. While
// a statement on orders holds orders' slot, a statement on public.orders (the same table,
// which {table: orders} selects) is refused: the per value is the table's bare name, however
// the statement spells it, so the table never runs two statements at once.
func TestPerTableSpellingSharesTheSlot(t *testing.T) {
	_, db := openRules(t, `
budgets:
  - {name: per-table, mode: enforce, max_concurrent: 1, per: table}
rules:
  - {budget: per-table, match: {table: orders}}
`)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `create table orders (id int)`); err != nil {
		t.Fatal(err)
	}
	rows, err := db.QueryContext(ctx, `select id from orders`) // holds orders' one slot until closed
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	_, err = db.ExecContext(ctx, `select count(*) from public.orders`)
	if err == nil {
		t.Fatal("select from public.orders admitted while orders' one slot (per: table) is held")
	}
	if be := asBlocked(t, err); be.Reason != driver.ReasonConcurrency {
		t.Fatalf("refused for %s; want concurrency", be.Reason)
	}
}
