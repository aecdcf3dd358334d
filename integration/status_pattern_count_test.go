package integration

import (
	"context"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestHottestPatternsCountExecutions: the status's hottest patterns count each pattern's
// executions and list the busiest first. A cheap pattern run 2,000 times and a 2 ms one run 300
// times under one costed budget: about 2,000 and 300 (the cheap pattern's count is an estimate
// past its first executions: one in 16 is timed and counts for 16), the cheap one first. It
// showed the samples the cost model trained on (about 180 for the cheap one), and listed the
// 2 ms pattern first.
func TestHottestPatternsCountExecutions(t *testing.T) {
	const rules = "server_cores: 2\nbudgets:\n  - {name: web, mode: enforce, server_share: 0.9}\nrules:\n  - {budget: web, match: {app: web}}\n"
	dsn := pgtest.Shared(t).CreateDatabase(t)
	p := openSizedPool(t, dsn, 2, driver.WithConfig(poolRules(t, rules)))
	c, db := openSizedDB(t, dsn, 2, driver.WithConfig(poolRules(t, rules)))
	for _, fe := range []struct {
		name     string
		exec     func(ctx context.Context, q string, args ...any) error
		snapshot func() driver.Snapshot
	}{
		{"NewPool", func(ctx context.Context, q string, args ...any) error { _, err := p.Exec(ctx, q, args...); return err }, p.Snapshot},
		{"Open", func(ctx context.Context, q string, args ...any) error {
			_, err := db.ExecContext(ctx, q, args...)
			return err
		}, c.Snapshot},
	} {
		t.Run(fe.name, func(t *testing.T) {
			ctx := tagging.With(context.Background(), "app", "web")
			const cheap, slow = 2000, 300
			for i := range cheap {
				if err := fe.exec(ctx, "select $1::int + 1", i); err != nil {
					t.Fatal(err)
				}
			}
			for range slow {
				if err := fe.exec(ctx, "select pg_sleep(0.002)"); err != nil {
					t.Fatal(err)
				}
			}
			var order []string
			counts := map[string]uint64{}
			for _, pat := range fe.snapshot().Patterns {
				counts[pat.Query] = pat.Count
				order = append(order, pat.Query)
			}
			t.Logf("patterns in order %q, counts %v", order, counts)
			if n := counts["select $1::int + $2"]; n < cheap*3/4 || n > cheap*5/4 {
				t.Errorf("the cheap pattern counts %d executions after %d", n, cheap)
			}
			if n := counts["select pg_sleep($1)"]; n < slow*9/10 || n > slow*11/10 {
				t.Errorf("the 2 ms pattern counts %d executions after %d", n, slow)
			}
			if len(order) == 0 || order[0] != "select $1::int + $2" {
				t.Errorf("hottest patterns in order %q; want the cheap one, run %d times against %d, first", order, cheap, slow)
			}
		})
	}
}
