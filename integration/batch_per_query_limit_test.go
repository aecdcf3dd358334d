package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestBatchOfCheapStatementsUnderPerQueryLimit: per_query_limit "caps the predicted cost
// of one statement" (driver/rules: Budget.PerQueryLimit); the quick start's "refuse a report
// predicted to take longer than 2 s"; and the README's pgx section: "A batch is decided whole
// before anything is sent (one refused statement refuses the batch, and every result returns
// the *driver.BlockedError)". A pgx batch (sqlc's :batchexec, a bulk of lookups) of 200
// statements of one pattern, each predicted at a few ms and each admitted alone, is admitted:
// the per-statement limit judges each statement, not the sum of the batch's costs (refused so,
// with RetryAfter 0, and "a pattern that only ever runs inside a pgx batch is not probed", it
// would be refused for good).
func TestBatchOfCheapStatementsUnderPerQueryLimit(t *testing.T) {
	p, _ := openPool(t, `
budgets:
  - {name: b, mode: enforce, per_query_limit: 100s, explain: pattern}
rules:
  - {budget: b, match: {app: x}}
`)
	bg := context.Background()
	for _, q := range []string{
		`create table rb (id int primary key, v int not null)`,
		`insert into rb select g, g from generate_series(1, 100000) g`,
		`analyze rb`,
	} {
		if _, err := p.Exec(bg, q); err != nil {
			t.Fatal(err)
		}
	}
	ctx := tagging.With(bg, "app", "x")
	const q = `select count(*) from rb where v % 7 = $1`
	for i := range 8 {
		if _, err := p.Exec(ctx, q, i%7); err != nil {
			t.Fatalf("single %d: %v", i, err)
		}
	}
	var pred float64
	for _, ps := range p.Snapshot().Patterns {
		if contains(ps.Query, "from rb where") {
			pred = ps.MeanCost
			t.Logf("status: count %d, mean cost %.4fs, mean plan cost %.0f, k %.3g", ps.Count, ps.MeanCost, ps.PlanCost, ps.K)
		}
	}
	if pred <= 0 {
		t.Fatal("the pattern has no learned cost")
	}
	// The limit: 20 times the statement's learned cost.
	limit := time.Duration(20 * pred * float64(time.Second)).Round(time.Millisecond)
	if err := p.SetConfig(poolRules(t, `
budgets:
  - {name: b, mode: enforce, per_query_limit: `+limit.String()+`, explain: pattern}
rules:
  - {budget: b, match: {app: x}}
`)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, q, 2); err != nil {
		t.Fatalf("single under the limit %v: %v", limit, err)
	}
	const n = 200
	b := &pgx.Batch{}
	for i := range n {
		b.Queue(q, i%7)
	}
	err := p.SendBatch(ctx, b).Close()
	var be *driver.BlockedError
	if errors.As(err, &be) {
		t.Errorf("a batch of %d statements, each predicted about %.4fs (a 20th of the per_query_limit: %v; each admitted alone "+
			"before and after), was refused: reason %s, limit %q, RetryAfter %v", n, pred, limit, be.Reason, be.Limit, be.RetryAfter)
	} else if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, q, 3); err != nil {
		t.Fatalf("single after: %v", err)
	}
}
