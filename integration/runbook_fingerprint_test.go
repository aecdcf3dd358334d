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
// pattern, takes its text from pg_stat_statements, and blocks it with the runbook's rule: a
// query with parameters, and reports sent with their literals inline (as ORMs, query builders
// and hand-written reports send them) that group or order by position, which pg_query leaves
// in its normalised text as pg_stat_statements does.
func TestRunbookFingerprintOfAnUnselectedPattern(t *testing.T) {
	srv := pgtest.Shared(t)
	dsn := srv.CreateDatabase(t)
	srv.EnableStatStatements(t, dsn)
	const rulesBefore = `budgets:
  - {name: reporting, mode: enforce, max_concurrent: 4}
rules:
  - {budget: reporting, match: {app: reporting}}
`
	c, db := openRulesOn(t, dsn, rulesBefore)
	ctx := tagging.With(context.Background(), "app", "web")
	if _, err := db.ExecContext(ctx, `create table runaway_orders (id int, created timestamptz, amount int);
		insert into runaway_orders select g, now() - g * interval '1 hour', g % 100 from generate_series(1, 2000) g`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, runaway string
		arg           []any
	}{
		{"parameters", "select count(*) from generate_series(1, $1::int) runaway_orders where runaway_orders % 7 = 3", []any{20000}},
		{"group by position", `select date_trunc('day', created), sum(amount) from runaway_orders where created > '2020-01-01' group by 1 order by 1`, nil},
		{"order by position", `select id, amount from runaway_orders where amount > 50 order by 2 desc limit 10`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setRulesOn(t, c, rulesBefore)
			run := func() error {
				rows, err := db.QueryContext(ctx, tc.runaway, tc.arg...)
				if err == nil {
					rows.Close()
					err = rows.Err()
				}
				return err
			}
			for range 5 {
				if err := run(); err != nil {
					t.Fatal(err)
				}
			}
			var text string
			if err := db.QueryRowContext(ctx, `select query from pg_stat_statements
				where dbid = (select oid from pg_database where datname = current_database())
				and query like $1 and query not like '%pg_stat_statements%' order by calls desc limit 1`,
				tc.runaway[:16]+"%runaway_orders%").Scan(&text); err != nil {
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
			if err := run(); !errors.Is(err, driver.ErrBlocked) {
				t.Fatalf("the runaway query %q after a rule blocking driver.Fingerprint(%q) = %s (the sent text's: %s): %v, want it blocked",
					tc.runaway, text, fp, driver.Fingerprint(tc.runaway), err)
			}
			var other int
			if err := db.QueryRowContext(ctx, "select count(*) from generate_series(1, $1::int)", 10).Scan(&other); err != nil {
				t.Errorf("another pattern refused by the block of %s: %v", fp, err)
			}
		})
	}
}
