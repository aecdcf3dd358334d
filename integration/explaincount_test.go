package integration

import (
	"context"
	"testing"
)

// TestExplainNotSentNotCounted: in an aborted transaction the EXPLAIN that would predict a
// statement's cost is never sent, so it counts neither as an EXPLAIN call nor as a failure.
func TestExplainNotSentNotCounted(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: b, mode: enforce, per_query_limit: 1000s, explain: call}
rules:
  - {budget: b, match: {statement: select}}
`)
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "begin"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "select 1/0"); err == nil {
		t.Fatal("select 1/0 did not fail")
	}
	before := c.Snapshot().Counters
	if _, err := conn.ExecContext(ctx, "select 1"); err == nil {
		t.Fatal("a statement in an aborted transaction succeeded")
	}
	after := c.Snapshot().Counters
	if after.ExplainCalls != before.ExplainCalls || after.ExplainFailures != before.ExplainFailures {
		t.Fatalf("EXPLAIN calls %d -> %d, failures %d -> %d: nothing was sent",
			before.ExplainCalls, after.ExplainCalls, before.ExplainFailures, after.ExplainFailures)
	}
	if _, err := conn.ExecContext(ctx, "rollback"); err != nil {
		t.Fatal(err)
	}
}
