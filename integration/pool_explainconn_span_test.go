package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestPoolConnWaitSpan: one CLIENT span per statement, blocked ones too. On driver.NewPool, a
// statement whose context ends while it waits for a pool connection leaves its span, whether it
// was decided before the connection (a budget with only slots) or waited for the connection its
// EXPLAIN needs (a budget with per_query_limit, a new pattern), for every statement kind.
func TestPoolConnWaitSpan(t *testing.T) {
	p, spans, _ := telPool(t, "1", `
budgets:
  - {name: slots, mode: enforce, max_concurrent: 4}
  - {name: costed, mode: enforce, max_concurrent: 4, per_query_limit: 5s}
rules:
  - {budget: slots, match: {app: slots}}
  - {budget: costed, match: {app: costed}}
`)
	if _, err := p.Exec(context.Background(), "create table items (id int)"); err != nil {
		t.Fatal(err)
	}
	// The pool's only connection is busy for the whole test.
	held, err := p.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()

	kinds := []struct {
		name string
		run  func(ctx context.Context) error
	}{
		{"Exec", func(ctx context.Context) error {
			_, err := p.Exec(ctx, "select count(*) from items where id > $1", 1)
			return err
		}},
		{"Query", func(ctx context.Context) error {
			rows, err := p.Query(ctx, "select id from items where id < $1", 2)
			if err == nil {
				rows.Close()
				err = rows.Err()
			}
			return err
		}},
		{"QueryRow", func(ctx context.Context) error {
			var n int
			return p.QueryRow(ctx, "select count(*) from items where id <> $1", 3).Scan(&n)
		}},
		{"SendBatch", func(ctx context.Context) error {
			b := &pgx.Batch{}
			b.Queue("select id from items where id = $1", 4)
			return p.SendBatch(ctx, b).Close()
		}},
		{"CopyFrom", func(ctx context.Context) error {
			_, err := p.CopyFrom(ctx, pgx.Identifier{"items"}, []string{"id"}, pgx.CopyFromRows([][]any{{5}}))
			return err
		}},
	}
	for _, budget := range []string{"slots", "costed"} {
		for _, k := range kinds {
			t.Run(budget+"/"+k.name, func(t *testing.T) {
				step := budget + "-" + k.name
				ctx, cancel := context.WithTimeout(tagging.With(context.Background(), "app", budget, "step", step), 300*time.Millisecond)
				defer cancel()
				err := k.run(ctx)
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("err %v, want the context's deadline (the pool's only connection is held)", err)
				}
				n := 0
				for _, sp := range spans.GetSpans() {
					if telAttr(sp.Attributes, "pgtraffic.tag.step").AsString() == step {
						n++
					}
				}
				if n != 1 {
					t.Errorf("%d spans for a %s of budget %q whose context ended waiting for a pool connection "+
						"(returned %v); the README promises one CLIENT span per statement, with error status", n, k.name, budget, err)
				}
			})
		}
	}
}
