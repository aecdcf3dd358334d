package integration

import (
	"context"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestColdPatternNotWarnedAsAFullLimit: driver/rules, Budget.WarningThreshold: "warns
// (even in enforce mode) when any limit is this full after a statement is admitted"; the
// README's rules example: "warning_threshold: 0.8 # warn (even in enforce mode) when a limit is
// 80% full"; and its cold start: a new pattern "reserves a slot's share of the burst instead
// ... at most per_query_limit", while "a guess above per_query_limit is still refused before it
// runs" (the guess, not the reservation, is what per_query_limit judges).
//
// A deploy: five new trivial patterns (select abs($1::int) and the like: planner cost 0.01,
// microseconds) under {enforce, server_share: 1, burst_limit: 10s, max_concurrent: 4,
// per_query_limit: 1s, warning_threshold: 0.8}. Each statement's prediction is microseconds,
// a few thousandths of per_query_limit: none is warned about as "per_query_limit=1s at 100%",
// as if the reservation of its unknown cost (burst_limit ÷ 5 = 2 s, cut to per_query_limit)
// were its cost. Nor, warm, run again. Both front ends.
func TestColdPatternNotWarnedAsAFullLimit(t *testing.T) {
	for _, front := range []string{"Open", "NewPool"} {
		t.Run(front, func(t *testing.T) {
			ctx := context.Background()
			dsn := pgtest.Shared(t).CreateDatabase(t)
			rules := `
server_cores: 1
budgets:
  - {name: b, mode: enforce, server_share: 1, burst_limit: 10s, max_concurrent: 4, per_query_limit: 1s, warning_threshold: 0.8}
rules:
  - {budget: b, match: {app: x}}
`
			log := &lockedBuffer{}
			var exec func(ctx context.Context, q string, args ...any) error
			var snap func() driver.Snapshot
			if front == "Open" {
				c, db := openSizedDB(t, dsn, 4, driver.WithConfig(poolRules(t, rules)), driver.WithLogger(log.logger()))
				exec = func(ctx context.Context, q string, args ...any) error {
					_, err := db.ExecContext(ctx, q, args...)
					return err
				}
				snap = c.Snapshot
			} else {
				p := openPoolAt(t, dsn, rules, driver.WithLogger(log.logger()))
				exec = func(ctx context.Context, q string, args ...any) error { _, err := p.Exec(ctx, q, args...); return err }
				snap = p.Snapshot
			}
			x := tagging.With(ctx, "app", "x")
			patterns := []string{"select abs($1::int)", "select sqrt($1::int)", "select ($1::int)::text", "select $1::int > 0", "select array[$1::int]"}
			var warned [2]uint64
			for round := range 2 {
				before := snap().Budgets[0].Warned
				for i, q := range patterns {
					if err := exec(x, q, i); err != nil {
						t.Fatal(err)
					}
				}
				warned[round] = snap().Budgets[0].Warned - before
			}
			var predicted float64
			for _, ps := range snap().Patterns {
				predicted = max(predicted, ps.MeanCost)
			}
			t.Logf("warned: %d of %d cold statements, %d of %d warm; the patterns' largest learned cost %.6fs", warned[0], len(patterns), warned[1], len(patterns), predicted)
			if warned[0] > 0 {
				t.Errorf("%d of %d statements of new patterns, each costing at most a few ms (largest learned cost %.6fs), warned as past warning_threshold 0.8 "+
					"of per_query_limit: 1s (none once warm: %d); log: %s", warned[0], len(patterns), predicted, warned[1], firstLine(log.String()))
			}
		})
	}
}

func firstLine(s string) string {
	for i, c := range s {
		if c == '\n' {
			return s[:i]
		}
	}
	return s
}
