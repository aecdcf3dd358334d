package guard

import "testing"

// TestNestedDisjunctionOfComplements: the README's FAQ and this package's documentation
// promise that require_where refuses a disjunction that holds for every row, naming
// "x IS NULL OR x IS NOT NULL" and "p OR NOT p" (an OR restricts only if every operand does and
// no two operands are complementary). A user expects the promise to hold however the OR is
// grouped: query builders (squirrel's sq.Or nested in sq.Or, GORM's Or(db.Where(...).Or(...)))
// emit "a OR (b OR c)", which PostgreSQL's parser does not flatten when the nested OR is on the
// right, and "NOT (a AND b)" is "NOT a OR NOT b" by the De Morgan reading the package documents.
// Each WHERE below holds for every row whose columns are not null, exactly as its flat form
// does, so each UPDATE and DELETE writes the whole table and must be refused.
func TestNestedDisjunctionOfComplements(t *testing.T) {
	for _, where := range []string{
		// The FAQ's own example, with the second half grouped with another condition.
		"deleted_at IS NULL OR (deleted_at IS NOT NULL OR archived)",
		// p OR NOT p, nested.
		"active OR (NOT active OR region = 'eu')",
		// x < 5 OR x >= 5, nested.
		"id < 5 OR (kind = 'a' OR id >= 5)",
		// p OR NOT (p AND q) is p OR NOT p OR NOT q.
		"active OR NOT (active AND archived)",
	} {
		for _, sql := range []string{"DELETE FROM t WHERE " + where, "UPDATE t SET a = 1 WHERE " + where} {
			if f := facts(sql); !f.UnsafeWrite {
				t.Errorf("%q: UnsafeWrite=false, want true (the condition holds for every row; its flat form is refused)", sql)
			}
		}
	}
}

// TestComplementOfAFlattenedDisjunction: "p OR NOT p" where p is itself a disjunction written
// first, as a query builder emits sq.Or{p, sq.Not(p)}: PostgreSQL's parser flattens the leading
// (a OR b) into the outer OR, so no operand is p any more, yet the condition still holds for
// every row (a OR b OR (NOT a AND NOT b)). Likewise a conjunction beside the negation of each of
// its operands (p AND q) OR NOT p OR NOT q, which is p OR NOT (p AND q) read through De Morgan.
func TestComplementOfAFlattenedDisjunction(t *testing.T) {
	for _, where := range []string{
		"(a OR b) OR NOT (a OR b)",
		"(region = 'eu' OR kind = 'a') OR NOT (region = 'eu' OR kind = 'a')",
		"(id < 5 OR archived) OR NOT (archived OR id < 5)",
		"(active AND archived) OR NOT active OR NOT archived",
		"(x = 1 AND y = 2) OR x <> 1 OR y <> 2",
	} {
		for _, sql := range []string{"DELETE FROM t WHERE " + where, "UPDATE t SET a = 1 WHERE " + where} {
			if f := facts(sql); !f.UnsafeWrite {
				t.Errorf("%q: UnsafeWrite=false, want true (the condition holds for every row)", sql)
			}
		}
	}
	// What still restricts: each operand of the conjunction must have its negation among the
	// others.
	for _, where := range []string{
		"(a OR b) OR NOT (a OR c)",
		"(x = 1 AND y = 2) OR x <> 1",
		"(a OR b) OR NOT (a OR b OR c)",
	} {
		if sql := "DELETE FROM t WHERE " + where; facts(sql).UnsafeWrite {
			t.Errorf("%q: UnsafeWrite=true, want false (some row fails the condition)", sql)
		}
	}
}
