package integration

import (
	"context"
	"errors"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestPerQueryLimitRefusesTheTwinOfACheapStatement: an ORM sends `… where false` for an empty
// IN list. After that cheap statement ran, the same statement without its WHERE (here a cross
// join of two 200,000-row tables, 40 billion rows) must still be refused by per_query_limit,
// priced by its own plan. pg_query's fingerprint left the constant WHERE out with its value:
// the two were one pattern, the cross join priced by its twin's cached plan and admitted.
func TestPerQueryLimitRefusesTheTwinOfACheapStatement(t *testing.T) {
	_, db := openRules(t, `
budgets:
  - {name: capped, mode: enforce, per_query_limit: 2s, max_duration: 3s}
rules:
  - {budget: capped, match: {app: capped}}
`)
	bg := context.Background()
	for _, q := range []string{
		"create table big_a as select g as id from generate_series(1, 200000) g",
		"create table big_b as select g as id from generate_series(1, 200000) g",
		"analyze big_a", "analyze big_b",
	} {
		if _, err := db.ExecContext(bg, q); err != nil {
			t.Fatal(err)
		}
	}
	ctx := tagging.With(bg, "app", "capped")
	const costly = "select count(*) from big_a a, big_b b"
	for range 3 {
		if _, err := db.ExecContext(ctx, costly+" where false"); err != nil {
			t.Fatal(err)
		}
	}
	_, err := db.ExecContext(ctx, costly)
	var be *driver.BlockedError
	if !errors.As(err, &be) || be.Reason != driver.ReasonPerQuery {
		t.Errorf("the cross join after its 'where false' twin ran: %v, want refused by per_query_limit", err)
	}
}
