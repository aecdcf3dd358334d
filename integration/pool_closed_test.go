package integration

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/puddle/v2"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestPoolClosedRefusesStatements: every kind of statement on a closed Pool returns
// ErrClosed, which matches puddle.ErrClosedPool too, as pgxpool's answer for a closed pool does
// (and the Pool's own Begin and Acquire give), and none is decided: the budget counts no admission (nor the metric, nor a span).
// Before, each was admitted and counted, then failed to take a connection with pgxpool's
// "closed pool".
func TestPoolClosedRefusesStatements(t *testing.T) {
	p, _ := openPool(t, "budgets: [{name: api, mode: enforce, max_concurrent: 4}]\nrules: [{budget: api, match: {app: api}}]\n")
	ctx := tagging.With(context.Background(), "app", "api")
	if _, err := p.Exec(ctx, "create table items (id int)"); err != nil {
		t.Fatal(err)
	}
	admitted := func() uint64 {
		b, _ := budgetNamed(p.Snapshot(), "api")
		return b.Admitted
	}
	before := admitted()
	p.Close()
	errs := map[string]error{}
	_, errs["Exec"] = p.Exec(ctx, "select 1")
	var n int
	errs["QueryRow"] = p.QueryRow(ctx, "select 1").Scan(&n)
	_, errs["Query"] = p.Query(ctx, "select 1")
	errs["SendBatch"] = p.SendBatch(ctx, &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{{SQL: "select 1"}}}).Close()
	_, errs["CopyFrom"] = p.CopyFrom(ctx, pgx.Identifier{"items"}, []string{"id"}, pgx.CopyFromRows([][]any{{1}}))
	for kind, err := range errs {
		if !errors.Is(err, driver.ErrClosed) || !errors.Is(err, puddle.ErrClosedPool) {
			t.Errorf("%s on a closed Pool: %v, want ErrClosed and puddle.ErrClosedPool", kind, err)
		}
	}
	if after := admitted(); after != before {
		t.Errorf("statements on a closed Pool counted as admitted: %d, then %d", before, after)
	}
}
