package integration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// coldWorkload runs a deploy's first requests: workers goroutines at once, each running the
// same patterns statements in the same order (patterns the process has never seen), through
// exec. It returns how many were refused.
func coldWorkload(t *testing.T, exec func(ctx context.Context, q string, args ...any) error, workers, patterns int) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(tagging.With(context.Background(), "app", "x"), 60*time.Second)
	defer cancel()
	var refused atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w := range workers {
		wg.Go(func() {
			<-start
			for j := range patterns {
				// A distinct alias per pattern: a distinct fingerprint (no digits: pg_query ignores them).
				a := string(rune('a'+j/26)) + string(rune('a'+j%26))
				q := fmt.Sprintf("select pg_sleep(0.003), count(*) from generate_series(1, 100) g%s where g%s <> $1", a, a)
				err := exec(ctx, q, w)
				var be *driver.BlockedError
				switch {
				case errors.As(err, &be):
					refused.Add(1)
				case err != nil:
					t.Errorf("%s: %v", q, err)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	return refused.Load()
}

// TestColdstartRefusesNothingRealCostsLeaveRoomFor: the README's cold start: "A cold start runs
// as far as that fits: a budget that the statements' real costs would never fill refuses
// nothing, and one that is full refuses them as when credit is short". A deploy on a pool of 4:
// 4 request goroutines at once each run the same 60 new patterns of about 3ms each. First the sum of their
// real costs, S, is measured on a budget that cannot refuse (a bucket that barely drains, so
// that its debt is that sum). Then the same cold workload, on a fresh process, runs under an
// enforce budget with max_concurrent 4 and a bucket of 2.5·S that barely drains: their real
// costs fill less than half of it, so nothing may be refused. Were each cold statement to
// reserve a quarter of the burst whatever the others left, with three of them in flight and the
// real debt past a quarter of the burst the next would find no room and be refused (reason
// budget): a deploy would refuse statements that the same budget admits once warm.
func TestColdstartRefusesNothingRealCostsLeaveRoomFor(t *testing.T) {
	const workers, patterns = 4, 60
	meter := "budgets:\n  - {name: b, mode: enforce, server_share: 0.0001, burst_limit: 10000s}\nrules:\n  - {budget: b, match: {app: x}}\n"
	for i, fe := range openFrontEnds(t, meter, 4) {
		t.Run(fe.name, func(t *testing.T) {
			if n := coldWorkload(t, fe.exec, workers, patterns); n != 0 {
				t.Fatalf("the meter refused %d", n)
			}
			// The real costs, trued up (a drain of 0.1 ms/s aside); never less than the sleeps.
			sum := max(fe.budget("b").Debt, workers*patterns*0.003)
			burst := 2.5 * sum
			rules := fmt.Sprintf("budgets:\n  - {name: b, mode: enforce, max_concurrent: 4, server_share: 0.0001, burst_limit: %dus}\n"+
				"rules:\n  - {budget: b, match: {app: x}}\n", int64(burst*1e6))
			cold := openFrontEnds(t, rules, 4)[i]
			refused := coldWorkload(t, cold.exec, workers, patterns)
			b := cold.budget("b")
			t.Logf("real costs %.1fms, burst %.1fms; cold: refused %d of %d, debt after %.1fms", sum*1e3, burst*1e3,
				refused, workers*patterns, b.Debt*1e3)
			// Had the refused statements run, their real costs would have added about their share of S.
			if all := b.Debt + float64(refused)*sum/(workers*patterns); all >= 0.9*burst {
				t.Fatalf("premise: this run's real costs (%.1fms) come near the burst (%.1fms)", all*1e3, burst*1e3)
			}
			if refused != 0 {
				t.Errorf("the cold start refused %d of %d statements (%v) under a burst of %.1fms that their real costs "+
					"(%.1fms in all, %.1fms this time) never fill", refused, workers*patterns, b.BlockedBy, burst*1e3, sum*1e3, b.Debt*1e3)
			}
		})
	}
}
