package integration

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestGuardsKeepTableUnchanged runs dangerous statements under require_where and
// block_truncate: every one is refused before it reaches the server, and the table keeps every
// row; the deliberate bypass and safe statements still run.
func TestGuardsKeepTableUnchanged(t *testing.T) {
	var logs lockedBuffer
	_, db := openRules(t, `
guards:
  require_where: enforce
  block_truncate: {mode: enforce, match: {app: web}}
`, driver.WithLogger(logs.logger()))
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `create table accounts (id int primary key, balance int);
		insert into accounts select g, 100 from generate_series(1, 50) g`); err != nil {
		t.Fatal(err)
	}
	web := tagging.With(ctx, "app", "web")
	for _, tc := range []struct {
		ctx   context.Context
		query string
		guard string
	}{
		{ctx, `delete from accounts`, "require_where"},
		{ctx, `update accounts set balance = 0`, "require_where"},
		{ctx, `update accounts set balance = 0 where 1 = 1`, "require_where"},
		{ctx, `delete from accounts where true or id = 3`, "require_where"},
		{ctx, `delete from accounts where id = id`, "require_where"},
		{ctx, `with gone as (delete from accounts returning *) select count(*) from gone`, "require_where"},
		{ctx, `select 1; delete from accounts`, "require_where"},
		{ctx, `delete from accounts /* pgtraffic bypass: a comment cannot bypass */`, "require_where"},
		{web, `truncate accounts`, "block_truncate"},
	} {
		_, err := db.ExecContext(tc.ctx, tc.query)
		be := asBlocked(t, err)
		if be.Reason != driver.ReasonGuard || be.Rule != tc.guard || be.Budget != tc.guard {
			t.Errorf("%q: %+v", tc.query, be)
		}
	}
	var n, sum int
	if err := db.QueryRowContext(ctx, `select count(*), sum(balance) from accounts`).Scan(&n, &sum); err != nil {
		t.Fatal(err)
	}
	if n != 50 || sum != 5000 {
		t.Fatalf("the guarded table changed: %d rows, balance %d", n, sum)
	}
	if !contains(logs.String(), "blocked by query guard") {
		t.Fatalf("no block logged:\n%s", logs.String())
	}

	// Safe statements and the deliberate bypass run.
	mustRun := func(ctx context.Context, q string, args ...any) sql.Result {
		t.Helper()
		res, err := db.ExecContext(ctx, q, args...)
		if err != nil {
			t.Fatalf("%q: %v", q, err)
		}
		return res
	}
	mustRun(ctx, `update accounts set balance = balance + 1 where id = $1`, 7)
	mustRun(ctx, `delete from accounts where id = 1 or id = 2`)
	res := mustRun(driver.WithGuardBypass(ctx), `update accounts set balance = 0`)
	if n, _ := res.RowsAffected(); n != 48 {
		t.Fatalf("bypassed update affected %d rows", n)
	}
	// block_truncate is scoped to app=web: the migration tool (untagged) may truncate.
	mustRun(ctx, `truncate accounts`)
}

func TestGuardWarnModeRuns(t *testing.T) {
	var logs lockedBuffer
	_, db := openRules(t, "guards:\n  require_where: warn\n", driver.WithLogger(logs.logger()))
	if _, err := db.Exec(`create table scratch (id int); insert into scratch values (1), (2)`); err != nil {
		t.Fatal(err)
	}
	res, err := db.Exec(`delete from scratch`)
	if err != nil || errors.Is(err, driver.ErrBlocked) {
		t.Fatalf("warn mode: %v", err)
	}
	if n, _ := res.RowsAffected(); n != 2 {
		t.Fatalf("deleted %d", n)
	}
	if !contains(logs.String(), "query guard matched") || !contains(logs.String(), "budget=require_where") {
		t.Fatalf("no warning logged:\n%s", logs.String())
	}
}
