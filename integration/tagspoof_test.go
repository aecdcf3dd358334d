package integration

import (
	"context"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestBuiltinTagsCannotBeSpoofed: a comment /*table='nothing'*/, or a context tag with the same
// claim, does not take a statement out of the {table: gt} budget or the block_truncate guard
// scoped to that table; the table keeps every row.
func TestBuiltinTagsCannotBeSpoofed(t *testing.T) {
	_, db := openRules(t, `
budgets:
  - {name: gt, mode: enforce, max_concurrent: 1}
rules:
  - {budget: gt, match: {table: gt}}
guards:
  block_truncate: {mode: enforce, match: {table: gt}}
`)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `create table gt (id int)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `insert into gt select generate_series(1, 10)`); err != nil {
		t.Fatal(err)
	}
	spoofCtx := tagging.With(ctx, "table", "nothing", "statement", "select")
	rows, err := db.QueryContext(ctx, `select id from gt`) // holds gt's one slot until closed
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ctx   context.Context
		query string
	}{
		{ctx, `select count(*) from gt /*table='nothing'*/`},
		{ctx, `select count(*) from gt /*table='nothing',username='postgres',app='x'*/`},
		{spoofCtx, `select count(*) from gt`},
	} {
		_, err := db.ExecContext(tc.ctx, tc.query)
		if be := asBlocked(t, err); be.Budget != "gt" || be.Reason != driver.ReasonConcurrency {
			t.Errorf("%q escaped the table's budget: %+v", tc.query, be)
		}
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ctx   context.Context
		query string
	}{
		{ctx, `truncate gt /*table='nothing'*/`},
		{ctx, `truncate gt /*table='nothing',statement='select'*/`},
		{spoofCtx, `truncate gt`},
	} {
		_, err := db.ExecContext(tc.ctx, tc.query)
		if be := asBlocked(t, err); be.Budget != "block_truncate" || be.Reason != driver.ReasonGuard {
			t.Errorf("%q escaped the table's guard: %+v", tc.query, be)
		}
	}
	var n int
	if err := db.QueryRowContext(ctx, `select count(*) from gt`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 10 {
		t.Fatalf("gt has %d rows; want 10", n)
	}
}
