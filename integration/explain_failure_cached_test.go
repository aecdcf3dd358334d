package integration

import (
	"context"
	"testing"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestFailedExplainIsCachedForItsTTL: the README promises one EXPLAIN round trip the first time
// a costed budget sees a pattern, then once a minute with explain: pattern. A pattern whose
// EXPLAIN fails although the statement itself runs fine must be remembered as a successful one
// is, or every execution pays an extra round trip and counts a failure. A common case: a jsonb
// parameter passed as []byte (what json.Marshal returns): pgx encodes it for the statement as
// JSON, knowing the parameter's type from its prepared description, while the EXPLAIN, whose
// arguments go untyped (internal/cost/pgxexplain), sends it as bytea text, not valid JSON.
func TestFailedExplainIsCachedForItsTTL(t *testing.T) {
	p, _ := openPool(t, `
budgets:
  - {name: b, mode: enforce, per_query_limit: 10s, explain: pattern}
rules:
  - {budget: b, match: {app: x}}
`)
	ctx := context.Background()
	if _, err := p.Exec(ctx, "create table docs (id int, body jsonb)"); err != nil {
		t.Fatal(err)
	}
	x := tagging.With(ctx, "app", "x")
	const runs = 10
	before := p.Snapshot().Counters
	for i := range runs {
		if _, err := p.Exec(x, "insert into docs values ($1, $2)", i, []byte(`{"a": 1}`)); err != nil {
			t.Fatalf("insert %d: %v", i, err)
		}
	}
	after := p.Snapshot().Counters
	calls, failures := after.ExplainCalls-before.ExplainCalls, after.ExplainFailures-before.ExplainFailures
	t.Logf("%d executions: %d EXPLAIN calls, %d failed", runs, calls, failures)
	if calls > 1 {
		t.Errorf("explain: pattern sent %d EXPLAINs (%d failed) for %d executions of one pattern within a minute; "+
			"want at most one: a failed EXPLAIN must be remembered for the pattern's TTL as a successful one is",
			calls, failures, runs)
	}
}
