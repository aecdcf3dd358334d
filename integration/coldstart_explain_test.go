package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestColdstartOneExplainPerPattern: the README's FAQ, "What does EXPLAIN cost? One
// round trip the first time a costed budget sees a pattern (then once a minute with
// explain: pattern ...)". At a deploy, the same request handler runs in many goroutines at
// once: 16 of them run the same 40 new patterns in the same order over 4 connections, under
// an enforce budget with explain: pattern. Every pattern is new once, so 40 EXPLAINs are what
// the README promises (no EXPLAIN fails here): a statement of a pattern that arrives while the
// pattern's first EXPLAIN is on its way waits for it rather than sending its own, so the
// deploy's first requests pay an EXPLAIN round trip per pattern, not per connection.
func TestColdstartOneExplainPerPattern(t *testing.T) {
	const workers, patterns = 16, 40
	rules := "budgets:\n  - {name: b, mode: enforce, server_share: 1, burst_limit: 100s, per_query_limit: 50s, explain: pattern}\n" +
		"rules:\n  - {budget: b, match: {app: x}}\n"
	p := pendingPool(t, 4, rules)
	c, db := openRules(t, rules)
	db.SetMaxOpenConns(4)
	db.SetMaxIdleConns(4)
	fronts := []struct {
		name     string
		exec     func(ctx context.Context, q string, args ...any) error
		counters func() driver.Counters
	}{
		{"NewPool", func(ctx context.Context, q string, args ...any) error { _, err := p.Exec(ctx, q, args...); return err },
			func() driver.Counters { return p.Snapshot().Counters }},
		{"Open", func(ctx context.Context, q string, args ...any) error {
			_, err := db.ExecContext(ctx, q, args...)
			return err
		},
			func() driver.Counters { return c.Snapshot().Counters }},
	}
	for _, fe := range fronts {
		t.Run(fe.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(tagging.With(context.Background(), "app", "x"), 60*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			start := make(chan struct{})
			for w := range workers {
				wg.Go(func() {
					<-start
					for j := range patterns {
						// A distinct alias per pattern: a distinct fingerprint.
						a := string(rune('a'+j/26)) + string(rune('a'+j%26))
						q := fmt.Sprintf("select count(*) from generate_series(1, 1000) g%s where g%s <> $1", a, a)
						if err := fe.exec(ctx, q, w); err != nil {
							t.Errorf("%s: %v", q, err)
						}
					}
				})
			}
			close(start)
			wg.Wait()
			n := fe.counters()
			t.Logf("%d statements of %d patterns: %d EXPLAINs (%d failed), %d cache misses", workers*patterns, patterns,
				n.ExplainCalls, n.ExplainFailures, n.ExplainCacheMisses)
			if n.ExplainFailures != 0 {
				t.Fatalf("%d EXPLAINs failed: not what this test is about", n.ExplainFailures)
			}
			if n.ExplainCalls > patterns {
				t.Errorf("%d new patterns cost %d EXPLAIN round trips (%.1f per pattern); the README promises one the first time",
					patterns, n.ExplainCalls, float64(n.ExplainCalls)/patterns)
			}
		})
	}
}
