package integration

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// TestServerClockCancelledBatchesHoldShare: TestServerClockCancelledStatementsHoldShare with
// the cancelled statements sent in pgx batches (pool.SendBatch). The README: "The server
// reports no statement that failed or was cancelled (a timeout, max_duration): such a
// statement is charged what it took on the client's clock, at least its prediction." A pattern
// on the server's clock (a fast pg_sleep that completes keeps it reported) whose batched
// statements the caller cuts off after 200ms (each would take 1 s): each ran 200ms on the
// server, which never reports it. Charged what they took, the server_share budget (0.1 of one
// core, burst 1s) keeps the time they take near share × elapsed + burst; charged the fast
// statements' mean, their prediction, they would run many times its share.
func TestServerClockCancelledBatchesHoldShare(t *testing.T) {
	srv := pgtest.Shared(t)
	dsn := srv.CreateDatabase(t)
	srv.EnableStatStatements(t, dsn)
	ctx := context.Background()
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 6
	cfg, err := driver.ParseConfig([]byte(`
server_cores: 1
health_interval: 250ms
budgets:
  - {name: sleeps, mode: enforce, server_share: 0.1, burst_limit: 1s}
rules:
  - {budget: sleeps, match: {app: sleeps}}
`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := driver.NewPoolFromConfig(ctx, pc, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tctx := tagCtx(ctx)
	const q = `select pg_sleep($1::float8)`
	status := func() (driver.PatternStatus, bool) {
		for _, ps := range p.Snapshot().Patterns {
			if strings.Contains(ps.Query, "pg_sleep") {
				return ps, true
			}
		}
		return driver.PatternStatus{}, false
	}
	batch := func(c context.Context, secs float64) error {
		b := &pgx.Batch{}
		b.Queue(q, secs)
		return p.SendBatch(c, b).Close()
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := batch(tctx, 0.001); err != nil && !errors.Is(err, driver.ErrBlocked) {
			t.Fatal(err)
		}
		if _, err := p.Exec(tctx, q, 0.001); err != nil && !errors.Is(err, driver.ErrBlocked) {
			t.Fatal(err)
		}
		if ps, ok := status(); ok && ps.Clock == driver.ClockServer {
			break
		}
		if time.Now().After(deadline) {
			ps, _ := status()
			t.Fatalf("the pattern never reached the server's clock: %+v", ps)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond) // let the bucket drain
	const window = 6 * time.Second
	var (
		ran      atomic.Int64
		admitted atomic.Int64
		refused  atomic.Int64
		wg       sync.WaitGroup
	)
	t0 := time.Now()
	wg.Go(func() {
		for time.Since(t0) < window {
			if err := batch(tctx, 0.001); err != nil && !errors.Is(err, driver.ErrBlocked) {
				t.Error(err)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	for range 3 {
		wg.Go(func() {
			for time.Since(t0) < window {
				c, cancel := context.WithTimeout(tctx, 200*time.Millisecond)
				s := time.Now()
				err := batch(c, 1.0)
				cancel()
				switch {
				case errors.Is(err, driver.ErrBlocked):
					refused.Add(1)
					time.Sleep(10 * time.Millisecond)
				default:
					admitted.Add(1)
					ran.Add(int64(time.Since(s)))
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(t0).Seconds()
	spent := float64(ran.Load()) / 1e9
	allowed := 0.1*elapsed + 1.0
	ps, _ := status()
	t.Logf("window %.1fs: %d cancelled batches admitted (ran %.2f s on the server in total), %d refused; share × elapsed + burst = %.2f s; pattern %+v",
		elapsed, admitted.Load(), spent, refused.Load(), allowed, ps)
	if spent > 2*allowed {
		t.Fatalf("cancelled batches ran %.2f s on the server, %.1f × what the budget allows (share 0.1 × %.1fs + burst 1s = %.2f s)",
			spent, spent/allowed, elapsed, allowed)
	}
}
