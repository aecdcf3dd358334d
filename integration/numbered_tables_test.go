package integration

import (
	"context"
	"errors"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestNumberedTablesArePricedApart: a deploy's first statements read tables
// whose names end in numbers, as monthly or sharded tables are named (events_202401,
// events_202402, orders_17). The README prices a statement under explain: pattern or auto by
// "its pattern's plan cost ... whatever its arguments", a pattern being a statement with its
// literals replaced, and says "a guess above per_query_limit is still refused before it runs".
// A count over a 200,000-row table is refused by a 5ms per_query_limit on a cold start
// (checked first on rv_small_a and rv_big_b). The same count over rv_events_202401 (200,000
// rows) must be refused just the same after a count over the new, empty rv_events_202402 ran:
// another table is not another argument. pg_query's fingerprint, on which pgtraffic's pattern
// is built, ignores runs of digits in a table's name: were both counts one pattern, the big
// table's count would be priced by the empty table's cached plan and admitted, its
// per_query_limit not applied (and a quarantine of one would refuse the other).
func TestNumberedTablesArePricedApart(t *testing.T) {
	fes := openFrontEnds(t, `
budgets:
  - {name: b, mode: enforce, per_query_limit: 5ms, explain: pattern}
rules:
  - {budget: b, match: {app: x}}
`, 4)
	for _, q := range []string{
		"create table rv_small_a (id int)", "create table rv_big_b (id int)",
		"create table rv_events_202401 (id int)", "create table rv_events_202402 (id int)",
		"insert into rv_big_b select generate_series(1, 200000)",
		"insert into rv_events_202401 select generate_series(1, 200000)",
		"analyze",
	} {
		if err := fes[0].exec(context.Background(), q); err != nil { // untagged: no budget
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, fe := range fes {
		t.Run(fe.name, func(t *testing.T) {
			ctx := tagging.With(context.Background(), "app", "x")
			refused := func(q string) bool {
				err := fe.exec(ctx, q)
				var be *driver.BlockedError
				if err != nil && !errors.As(err, &be) {
					t.Fatalf("%s: %v", q, err)
				}
				return be != nil && be.Reason == driver.ReasonPerQuery
			}
			// The contrast: tables named without numbers.
			if refused("select count(*) from rv_small_a") {
				t.Fatal("the tiny table's count is refused")
			}
			if !refused("select count(*) from rv_big_b") {
				t.Fatal("the big table's count is admitted under a 5ms per_query_limit: the premise fails")
			}
			// The same two statements over tables named by month.
			if refused("select count(*) from rv_events_202402") {
				t.Fatal("the new month's (empty) count is refused")
			}
			if !refused("select count(*) from rv_events_202401") {
				t.Error("select count(*) from rv_events_202401 (200,000 rows) was admitted, priced by the plan of the " +
					"empty rv_events_202402: two tables whose names differ only in their numbers are one pattern, and the " +
					"per_query_limit that refuses the same statement over rv_big_b does not apply")
			}
		})
	}
}
