package engine

import (
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/pattern"
)

// TestQuarantineTableFull: once the table is full of one budget's patterns (an ORM's churn of
// patterns under a tight per_query_limit), another budget still quarantines its overrunning
// pattern, and so does the churning budget: room is made from the budget that holds the most,
// taking a pattern with strikes only before the quarantine that ends first. The table never
// exceeds its bound.
func TestQuarantineTableFull(t *testing.T) {
	spec := rules.Quarantine{After: 1, For: rules.Duration(time.Hour)}
	var q quarantines
	q.configure([]rules.Budget{
		{Name: "fill", Mode: "enforce", Quarantine: &spec},
		{Name: "guard", Mode: "enforce", Quarantine: &spec},
	})
	fill := &budgetState{name: "fill", quarantine: &spec}
	guard := &budgetState{name: "guard", quarantine: &spec}
	now := time.Unix(1_700_000_000, 0)
	for i := range maxQuarantined + 500 {
		q.strike(now.Add(time.Duration(i)*time.Millisecond), now, fill, &pattern.Pattern{FingerprintID: uint64(i + 1)})
	}
	if n := len(q.m); n != maxQuarantined {
		t.Fatalf("%d entries, want the bound %d", n, maxQuarantined)
	}
	later := now.Add(time.Minute)
	if _, ok := q.until(later, "fill", &pattern.Pattern{FingerprintID: maxQuarantined + 500}); !ok {
		t.Error("the churning budget's newest overrunning pattern is not quarantined")
	}
	if _, ok := q.until(later, "fill", &pattern.Pattern{FingerprintID: 1}); ok {
		t.Error("the quarantine that ends first was kept over a newer one")
	}
	bad := &pattern.Pattern{FingerprintID: 1 << 40}
	q.strike(later, later, guard, bad)
	if _, ok := q.until(later, "guard", bad); !ok {
		t.Fatal("with the table full of another budget's patterns, an overrunning pattern is not quarantined")
	}
	if n := len(q.m); n != maxQuarantined {
		t.Fatalf("%d entries, want the bound %d", n, maxQuarantined)
	}
}
