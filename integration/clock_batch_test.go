package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/delayproxy"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// rscKindsConfig: a budget that drains next to nothing and never refuses, so that its debt
// is what its statements were charged.
const rscKindsConfig = `
server_cores: 1
health_interval: 250ms
budgets:
  - {name: lookups, mode: enforce, server_share: 0.0001, burst_limit: 1000s}
rules:
  - {budget: lookups, match: {table: t}}
`

type rscKindsFront interface {
	Snapshot() driver.Snapshot
}

// rscKindsRun runs op from 4 workers through a 1 ms round trip (the test's delaying proxy)
// until the pattern whose text contains match is on the server's clock, then 4 s more, and
// compares the budget's debt with the server seconds pg_stat_statements counts for text.
func rscKindsRun(t *testing.T, text, match string, open func(t *testing.T, pc *pgxpool.Config) (rscKindsFront, func(ctx context.Context) error)) rscKindsResult {
	srv := pgtest.Shared(t)
	ctx := context.Background()
	dsn, admin := lookupDatabase(t, srv)
	var dbid uint32
	if err := admin.QueryRow(ctx, `select oid from pg_database where datname = current_database()`).Scan(&dbid); err != nil {
		t.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 4
	pc.ConnConfig.Host, pc.ConnConfig.Port = delayproxy.Start(t, fmt.Sprintf("%s:%d", pc.ConnConfig.Host, pc.ConnConfig.Port), 500*time.Microsecond).HostPort()
	if _, err := admin.Exec(ctx, `select pg_stat_statements_reset()`); err != nil {
		t.Fatal(err)
	}
	front, op := open(t, pc)
	status := func() (driver.PatternStatus, bool) {
		for _, ps := range front.Snapshot().Patterns {
			if strings.Contains(ps.Query, match) {
				return ps, true
			}
		}
		return driver.PatternStatus{}, false
	}
	var wg sync.WaitGroup
	var stop atomic.Bool
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			for !stop.Load() {
				if err := op(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	debtOf := func() float64 {
		for _, b := range front.Snapshot().Budgets {
			if b.Name == "lookups" {
				return b.Debt
			}
		}
		return 0
	}
	serverOf := func() (int64, float64) {
		var calls int64
		var execMS float64
		if err := admin.QueryRow(ctx, `select coalesce(sum(calls), 0)::int8, coalesce(sum(total_exec_time), 0)
			from pg_stat_statements where dbid = $1 and toplevel and query = $2`, dbid, text).Scan(&calls, &execMS); err != nil {
			t.Fatal(err)
		}
		return calls, execMS / 1e3
	}
	waitFor(t, 40*time.Second, "the pattern on the server's clock", func() (bool, string) {
		ps, ok := status()
		return ok && ps.Clock == driver.ClockServer, fmt.Sprintf("%v %+v", ok, ps)
	})
	time.Sleep(time.Second) // its first charges trued up
	debt0 := debtOf()
	calls0, server0 := serverOf()
	time.Sleep(3 * time.Second)
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a statement failed: %v", err)
	}
	time.Sleep(time.Second) // the last statements' report
	debt := debtOf()
	calls, server := serverOf()
	ps, _ := status()
	r := rscKindsResult{total: debt / server, first: debt0 / server0, window: (debt - debt0) / (server - server0)}
	t.Logf("when on the server's clock: the budget owed %.2f ms, the server had spent %.2f ms (%.2f×)", debt0*1e3, server0*1e3, r.first)
	t.Logf("%d statements: the budget owes %.2f ms, the server spent %.2f ms (%.2f×); on the server's clock (%d statements): owes %.2f ms more, the server spent %.2f ms more (%.2f×); pattern %+v; floor %v",
		calls, debt*1e3, server*1e3, r.total, calls-calls0, (debt-debt0)*1e3, (server-server0)*1e3, r.window, ps, front.Snapshot().Counters.NetworkFloor)
	if calls-calls0 == 0 || server-server0 <= 0 {
		t.Fatalf("the server reports no statements of %q", text)
	}
	return r
}

// rscKindsResult: the budget's debt over the server's seconds of the statements, at the end
// (total), when the pattern had been on the server's clock for a second (first: its first
// charges trued up), and over the window between the two (window).
type rscKindsResult struct{ total, first, window float64 }

func rscPool(t *testing.T, pc *pgxpool.Config) *driver.Pool {
	cfg, err := driver.ParseConfig([]byte(rscKindsConfig))
	if err != nil {
		t.Fatal(err)
	}
	p, err := driver.NewPoolFromConfig(context.Background(), pc, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// rscBatchOp sends, from p, a batch of 4 lookups, and extra after them when it is not "".
func rscBatchOp(p *driver.Pool, extra string) func(context.Context) error {
	return func(ctx context.Context) error {
		b := &pgx.Batch{}
		for range 4 {
			b.Queue(ssLookup, rand.IntN(1000)+1)
		}
		if extra != "" {
			b.Queue(extra)
		}
		return p.SendBatch(ctx, b).Close()
	}
}

// TestClockBatchFirstChargesTruedUp: the README's promise that "Until its first
// report ... a pattern's statements are charged on the client's clock ...; while the server's
// clock is read, those charges are kept ... and the pattern's first report trues each up to the
// server's mean, in the budget's bucket ..., so that a deploy does not fill a tight budget with
// its first lookups' round trips", for lookups sent in pgx batches (pool.SendBatch, one of the
// controlled calls), as TestFirstChargesTruedUpByTheServer checks it for single lookups: once
// the reports are in, the budget owes what the server spent (0.5–2×).
func TestClockBatchFirstChargesTruedUp(t *testing.T) {
	r := rscKindsRun(t, ssLookup, "from t where id", func(t *testing.T, pc *pgxpool.Config) (rscKindsFront, func(context.Context) error) {
		p := rscPool(t, pc)
		return p, rscBatchOp(p, "")
	})
	if r.first < 0.5 || r.first > 2 {
		t.Errorf("once the batched lookups were on the server's clock, the budget owed %.2f × what the server had spent on them, want 0.5–2× (on the server's clock alone: %.2f×)", r.first, r.window)
	}
}

// TestClockMixedBatchChargedItsBudgetsStatements: a statement on the server's clock is charged
// its predicted server cost, trued up from what the server reports for its pattern, not from
// the client's wall clock, also in a batch beside a statement its budget does not hold. A batch of 4 lookups under the budget, and one
// statement that no rule selects (select 1): once the lookups' pattern is on the server's clock,
// the budget must be charged about what the server spent on the lookups (0.5–2×) rather than
// the batch's round trip on the client's clock.
func TestClockMixedBatchChargedItsBudgetsStatements(t *testing.T) {
	r := rscKindsRun(t, ssLookup, "from t where id", func(t *testing.T, pc *pgxpool.Config) (rscKindsFront, func(context.Context) error) {
		p := rscPool(t, pc)
		return p, rscBatchOp(p, "select 1")
	})
	if r.window < 0.5 || r.window > 2 {
		t.Errorf("on the server's clock the budget was charged %.2f × what the server spent on the batched lookups, want 0.5–2×", r.window)
	}
}
