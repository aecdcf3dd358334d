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

// TestPoolRefusalNeedingNoCostTakesNoConn: the README ("Size the application's pool")
// and the Pool's doc say a refused statement takes no connection whenever its decision needs no
// EXPLAIN, and the pool's front end checks zero limits and health before it acquires. A budget
// closed by a zero limit (max_concurrent: 0, server_share: 0) or throttled by its health
// threshold refuses every statement whatever it costs: no EXPLAIN can change that decision. So
// with the pool's only connection busy, a statement of such a budget must be refused at once
// with a *BlockedError, even when its pattern is new (the first statements after a deploy, or
// every statement under explain: call) and the budget also has a bucket. Today the engine
// asks for the connection to cost the statement (ErrNeedConn) before it looks at zero limits or
// health: the refused statement waits for the busy pool until its context ends, and gets a
// context error instead of its refusal. That is the kill switch an operator pulls during an
// incident, exactly when the pool is exhausted.
func TestPoolRefusalNeedingNoCostTakesNoConn(t *testing.T) {
	cases := []struct{ name, budget string }{
		{"max_concurrent 0", `{name: r, mode: enforce, max_concurrent: 0, server_share: 0.5}`},
		{"explain call, max_concurrent 0", `{name: r, mode: enforce, max_concurrent: 0, explain: call, server_share: 1}`},
		{"in_flight throttled", `{name: r, mode: enforce, server_share: 0.5, throttle_when: {in_flight: 0}}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := pendingPool(t, 1, "budgets: ["+c.budget+"]\nrules: [{budget: r, match: {app: report}}]\n")
			// The pool's only connection is busy with uncontrolled work: open rows on it.
			conn, err := p.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			rows, err := conn.Query(context.Background(), "select generate_series(1, 3)")
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()

			ctx, cancel := context.WithTimeout(tagging.With(context.Background(), "app", "report"), 3*time.Second)
			defer cancel()
			_, err = p.Exec(ctx, "select count(*) from generate_series(1, 10)")
			var be *driver.BlockedError
			if !errors.As(err, &be) {
				t.Fatalf("a statement its budget refuses whatever it costs, with the pool's only connection busy: "+
					"got %v, want a *BlockedError at once (it waited for a connection it did not need)", err)
			}
			// A batch is decided alike, before its connection.
			batch := &pgx.Batch{}
			batch.Queue("select 1")
			batch.Queue("select count(*) from generate_series(1, 20)")
			br := p.SendBatch(ctx, batch)
			_, err = br.Exec()
			br.Close()
			if !errors.As(err, &be) {
				t.Fatalf("a batch its budget refuses whatever it costs, with the pool's only connection busy: "+
					"got %v, want a *BlockedError at once", err)
			}
		})
	}
}
