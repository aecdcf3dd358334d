package integration

import (
	"context"
	"errors"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestRunbookFingerprintOfAnUnselectedPattern: the incident runbook's first recipe blocks one
// query pattern by its fingerprint. The pattern to block is typically one that no budget selects
// yet (a new endpoint's query hammering the database), so the status page does not list it; its
// text does show in pg_stat_statements, normalised ($n for its literals), and
// driver.Fingerprint of that text is the fingerprint a rule blocks it by. The test runs such a
// pattern, takes its text from pg_stat_statements, and blocks it with the runbook's rule.
func TestRunbookFingerprintOfAnUnselectedPattern(t *testing.T) {
	srv := pgtest.Shared(t)
	dsn := srv.CreateDatabase(t)
	srv.EnableStatStatements(t, dsn)
	c, db := openRulesOn(t, dsn, `budgets:
  - {name: reporting, mode: enforce, max_concurrent: 4}
rules:
  - {budget: reporting, match: {app: reporting}}
`)
	ctx := tagging.With(context.Background(), "app", "web")
	const runaway = "select count(*) from generate_series(1, $1::int) runaway where runaway % 7 = 3"
	for i := range 30 {
		var n int
		if err := db.QueryRowContext(ctx, runaway, 20000+i).Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	var text string
	if err := db.QueryRowContext(ctx, `select query from pg_stat_statements
		where dbid = (select oid from pg_database where datname = current_database())
		and query like '%runaway%' and query not like '%pg_stat_statements%' order by calls desc limit 1`).Scan(&text); err != nil {
		t.Fatalf("the runaway query's text in pg_stat_statements: %v", err)
	}
	fp := driver.Fingerprint(text)
	setRulesOn(t, c, `budgets:
  - {name: reporting, mode: enforce, max_concurrent: 4}
  - {name: incident-block, mode: enforce, max_concurrent: 0}
rules:
  - {budget: reporting, match: {app: reporting}}
  - budget: incident-block
    match: {fingerprint: `+fp+`}
`)
	var n int
	err := db.QueryRowContext(ctx, runaway, 12345).Scan(&n)
	if !errors.Is(err, driver.ErrBlocked) {
		t.Fatalf("the runaway query after a rule blocking driver.Fingerprint(%q) = %s: %v, want it blocked", text, fp, err)
	}
	var other int
	if err := db.QueryRowContext(ctx, "select count(*) from generate_series(1, $1::int)", 10).Scan(&other); err != nil {
		t.Errorf("another pattern refused by the block of %s: %v", fp, err)
	}
}
