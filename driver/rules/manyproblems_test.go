package rules

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// budgetsJSON is a generated rules file of n budgets, each written as entry (with %d for its
// index), as a program generates a budget per tenant.
func budgetsJSON(n int, entry string) []byte {
	var sb strings.Builder
	sb.WriteString("{\"budgets\": [\n")
	for i := range n {
		if i > 0 {
			sb.WriteString(",\n")
		}
		fmt.Fprintf(&sb, entry, i)
	}
	sb.WriteString("]}\n")
	return []byte(sb.String())
}

// TestManyProblemsParseInLinearTime: the package documentation says parsing and validation
// take time in proportion to the file, and that a budget per tenant for 100,000 tenants is an
// ordinary file, best generated as JSON. A generator with a bug (a field name misspelt, max_wait
// left out) writes such a file with two problems per budget: a decoding problem (unknown field)
// and a validation problem (max_queue without max_wait). Each validation problem is checked for
// a decoding problem near it; were that a loop over all of them (problems × problems), 20,000
// budgets (1.1 MB) would take seconds against 0.04 s for the same file without the problems,
// and 100,000 minutes, during which the watcher could apply no corrected file.
func TestManyProblemsParseInLinearTime(t *testing.T) {
	const n = 20000
	good := budgetsJSON(n, `{"name": "t-%d", "max_concurrent": 4, "max_wait": "1s", "max_queue": 2}`)
	bad := budgetsJSON(n, `{"name": "t-%d", "max_concurent": 4, "max_queue": 2}`)
	start := time.Now()
	if _, err := Parse(good); err != nil {
		t.Fatal(err)
	}
	tookGood := time.Since(start)
	start = time.Now()
	_, err := Parse(bad)
	tookBad := time.Since(start)
	if err == nil {
		t.Fatal("the broken file parsed")
	}
	t.Logf("%d budgets: valid file %v, file with 2 problems per budget %v", n, tookGood, tookBad)
	if limit := max(2*time.Second, 20*tookGood); tookBad > limit {
		t.Fatalf("the file with problems took %v to be refused (the valid one %v; limit %v): "+
			"time quadratic in the number of problems", tookBad, tookGood, limit)
	}
}

// TestNearFailures: a validation error is dropped when a decoding error was reported at its
// field, above it or below it, and kept otherwise; a key's quoted '.' or '[' is not a step.
func TestNearFailures(t *testing.T) {
	failed := failedFields([]*Error{
		{Field: "budgets[3].max_concurent"},
		{Field: `health_queries["a.b[c"]`},
	})
	for _, tc := range []struct {
		path string
		near bool
	}{
		{"budgets[3].max_concurent", true}, // at it
		{"budgets[3]", true},               // above it
		{"budgets", true},
		{"", true},
		{"budgets[3].max_concurent.x", true}, // below it
		{"budgets[3].max_queue", false},      // beside it
		{"budgets[30]", false},
		{"budgets[3].max_concurrent", false},
		{"rules[0].budget", false},
		{`health_queries["a.b[c"]`, true},
		{"health_queries", true},
		{`health_queries["a`, false}, // not a field: the quoted key is one step
		{`health_queries["a.b"]`, false},
	} {
		if got := failed.near(tc.path); got != tc.near {
			t.Errorf("near(%q) = %v, want %v", tc.path, got, tc.near)
		}
	}
	if failedFields([]*Error{{Field: ""}}).near("rules[0].budget") != true {
		t.Errorf("an error at the top is near every field")
	}
	if failedFields(nil).near("") {
		t.Errorf("no decoding error is near nothing")
	}
}
