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
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestServerClockCancelledStatementsHoldShare: a pattern on the server's clock is charged the
// server's mean per statement. Statements of that pattern that the application cancels (a
// request timeout of 200ms on a statement that would take 1 s, beside fast statements that
// complete) run 200ms each on the server, yet pg_stat_statements never counts a cancelled
// statement: charged the mean of the fast ones, they ran many times the budget. A statement that
// fails is charged what it took on the client's clock, and the server_share budget (0.1 of one
// core, burst 1 s) keeps the server time they take near share × elapsed + burst; so is a pgx
// batch (pool.SendBatch) of such a statement, the README's "such a statement is charged what it
// took on the client's clock, at least its prediction" holding for both.
func TestServerClockCancelledStatementsHoldShare(t *testing.T) {
	srv := pgtest.Shared(t)
	dsn := srv.CreateDatabase(t)
	srv.EnableStatStatements(t, dsn)
	const q = `select pg_sleep($1::float8)`
	for _, tt := range []struct {
		name string
		send func(ctx context.Context, p *driver.Pool, secs float64) error
	}{
		{"Exec", func(ctx context.Context, p *driver.Pool, secs float64) error {
			_, err := p.Exec(ctx, q, secs)
			return err
		}},
		{"SendBatch", func(ctx context.Context, p *driver.Pool, secs float64) error {
			b := &pgx.Batch{}
			b.Queue(q, secs)
			return p.SendBatch(ctx, b).Close()
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cancelledHoldShare(t, dsn, q, tt.send)
		})
	}
}

// cancelledHoldShare runs TestServerClockCancelledStatementsHoldShare's experiment with its
// statements of q sent by send.
func cancelledHoldShare(t *testing.T, dsn, q string, send func(ctx context.Context, p *driver.Pool, secs float64) error) {
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
	status := func() (driver.PatternStatus, bool) {
		for _, ps := range p.Snapshot().Patterns {
			if strings.Contains(ps.Query, "pg_sleep") {
				return ps, true
			}
		}
		return driver.PatternStatus{}, false
	}
	// Warm: fast statements until the pattern is on the server's clock (as its executions and
	// the server's reports allow on a loaded machine).
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := send(tctx, p, 0.001); err != nil && !errors.Is(err, driver.ErrBlocked) {
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
	// Measure: 3 workers whose statements are cut off by the caller's 200ms timeout, beside one
	// that keeps running the pattern's fast statements (so that the server keeps reporting it).
	const window = 6 * time.Second
	var (
		ran      atomic.Int64 // nanoseconds admitted statements ran
		admitted atomic.Int64
		refused  atomic.Int64
		wg       sync.WaitGroup
	)
	t0 := time.Now()
	wg.Go(func() {
		for time.Since(t0) < window {
			if err := send(tctx, p, 0.001); err != nil && !errors.Is(err, driver.ErrBlocked) {
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
				err := send(c, p, 1.0)
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
	t.Logf("window %.1fs: %d admitted (ran %.2f s on the server in total), %d refused; share × elapsed + burst = %.2f s; pattern %+v",
		elapsed, admitted.Load(), spent, refused.Load(), allowed, ps)
	if spent > 2*allowed {
		t.Fatalf("cancelled statements ran %.2f s on the server, %.1f × what the budget allows (share 0.1 × %.1fs + burst 1s = %.2f s)",
			spent, spent/allowed, elapsed, allowed)
	}
}

func tagCtx(ctx context.Context) context.Context {
	return tagging.With(ctx, "app", "sleeps")
}
