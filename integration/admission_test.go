package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
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

// Admission before the pool: controlled work must not hold the connections the rest of the
// application needs. Each test is the scenario as an application meets it, on both front ends.

// frontEnd is one of pgtraffic's front ends as an application uses it: a statement with its
// tags in ctx, and the budget's status.
type frontEnd struct {
	name string
	exec func(ctx context.Context, sql string, args ...any) error
	ints func(ctx context.Context, sql string) ([]int, error) // a query's one int column
	// hold runs a query whose rows stay open, holding its budget slots, until release.
	hold   func(ctx context.Context, sql string) (release func(), err error)
	wait   func(ctx context.Context) error // the front end's Wait
	budget func(name string) driver.BudgetStatus
	// setRules replaces the rules in force (SetConfig), budgets that stay keeping their state.
	setRules func(rules string) error
}

// openFrontEnds opens both front ends on one fresh database with rules, each with at most
// maxConns connections: a *driver.Pool (MaxConns) and a *sql.DB (SetMaxOpenConns).
func openFrontEnds(t *testing.T, rules string, maxConns int32) []frontEnd {
	t.Helper()
	dsn := pgtest.Shared(t).CreateDatabase(t)
	cfg, err := driver.ParseConfig([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	p := openSizedPool(t, dsn, maxConns, driver.WithConfig(cfg))
	c, db := openSizedDB(t, dsn, maxConns, driver.WithConfig(cfg))
	return []frontEnd{
		{name: "NewPool",
			exec: func(ctx context.Context, q string, args ...any) error {
				_, err := p.Exec(ctx, q, args...)
				return err
			},
			ints: func(ctx context.Context, q string) ([]int, error) {
				rows, _ := p.Query(ctx, q)
				return pgx.CollectRows(rows, pgx.RowTo[int])
			},
			hold: func(ctx context.Context, q string) (func(), error) {
				rows, err := p.Query(ctx, q)
				return rows.Close, err
			},
			wait:     p.Wait,
			budget:   func(name string) driver.BudgetStatus { return poolBudget(t, p, name) },
			setRules: func(rules string) error { return p.SetConfig(poolRules(t, rules)) }},
		{name: "Open",
			exec: func(ctx context.Context, q string, args ...any) error {
				_, err := db.ExecContext(ctx, q, args...)
				return err
			},
			ints: func(ctx context.Context, q string) ([]int, error) {
				rows, err := db.QueryContext(ctx, q)
				if err != nil {
					return nil, err
				}
				defer rows.Close()
				var out []int
				for rows.Next() {
					var i int
					if err := rows.Scan(&i); err != nil {
						return nil, err
					}
					out = append(out, i)
				}
				return out, rows.Err()
			},
			hold: func(ctx context.Context, q string) (func(), error) {
				rows, err := db.QueryContext(ctx, q)
				if err != nil {
					return nil, err
				}
				return func() { rows.Close() }, nil
			},
			wait:     c.Wait,
			budget:   func(name string) driver.BudgetStatus { return budgetStatus(t, c, name) },
			setRules: func(rules string) error { return c.SetConfig(poolRules(t, rules)) }},
	}
}

// openSizedPool opens a *driver.Pool on dsn with at most maxConns connections, closed when the
// test ends.
func openSizedPool(t *testing.T, dsn string, maxConns int32, opts ...driver.Option) *driver.Pool {
	t.Helper()
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = maxConns
	p, err := driver.NewPoolFromConfig(context.Background(), pc, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// openSizedDB opens a *sql.DB over a driver.NewConnector on dsn with at most maxConns
// connections, all of them kept idle for reuse, closed when the test ends.
func openSizedDB(t *testing.T, dsn string, maxConns int32, opts ...driver.Option) (*driver.Connector, *sql.DB) {
	t.Helper()
	c, err := driver.NewConnector(dsn, opts...)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(int(maxConns))
	db.SetMaxIdleConns(int(maxConns))
	t.Cleanup(func() { db.Close() })
	return c, db
}

// TestReportsWaitingDoNotStarveCheckouts is the scenario of a pool of 4 connections shared by
// 2 checkout workers (select 1) and 6 report workers (pg_sleep(0.3), app=reporting, a refused
// one retried after its RetryAfter) under {enforce, max_concurrent: 1, max_wait: 3s}: the
// checkouts beside the reports keep at least 0.9 of their throughput alone on the pool, which
// decides before it takes a connection, and at least 0.5 under database/sql, where a waiting
// statement holds its connection (at most max_concurrent + max_queue of them). The reports
// still run, one at a time.
//
// "Alone" is a twin of the same front end, pool size and rules, whose checkouts run in the same
// windows with no reports beside them: both sides meet the same load on the machine at the same
// time, so the ratio does not move with it.
func TestReportsWaitingDoNotStarveCheckouts(t *testing.T) {
	const rules = `
budgets:
  - {name: reporting, mode: enforce, max_concurrent: 1, max_wait: 3s}
rules:
  - {budget: reporting, match: {app: reporting}}
`
	const (
		// A checkout thinks between its statements, as a request handler does: its throughput
		// then follows its connections' availability rather than its share of a saturated CPU,
		// which two identical pools on a 2-core machine split unevenly from run to run.
		think   = time.Millisecond
		window  = 3 * time.Second
		report  = 300 * time.Millisecond
		workers = 6
	)
	shared, twins := openFrontEnds(t, rules, 4), openFrontEnds(t, rules, 4)
	for k, fe := range shared {
		twin := twins[k]
		t.Run(fe.name, func(t *testing.T) {
			checkouts := func(ctx context.Context, fe frontEnd, n *atomic.Int64, wg *sync.WaitGroup) {
				for range 2 {
					wg.Go(func() {
						for ctx.Err() == nil {
							if err := fe.exec(ctx, "select 1"); err == nil {
								n.Add(1)
							} else if ctx.Err() == nil {
								t.Errorf("checkout: %v", err)
								return
							}
							time.Sleep(think)
						}
					})
				}
			}
			var alone, beside, done, refused, maxRunning atomic.Int64
			var warm sync.WaitGroup
			wctx, cancel := context.WithTimeout(context.Background(), report)
			checkouts(wctx, fe, new(atomic.Int64), &warm) // connections open and code warm
			checkouts(wctx, twin, new(atomic.Int64), &warm)
			warm.Wait()
			cancel()

			reportsCtx, stopReports := context.WithCancel(tagging.With(context.Background(), "app", "reporting"))
			var reports sync.WaitGroup
			for range workers {
				reports.Go(func() {
					for reportsCtx.Err() == nil {
						err := fe.exec(reportsCtx, "select pg_sleep($1::float8)", report.Seconds())
						var be *driver.BlockedError
						switch {
						case err == nil:
							done.Add(1)
						case errors.As(err, &be):
							refused.Add(1)
							select {
							case <-reportsCtx.Done():
							case <-time.After(max(be.RetryAfter, time.Millisecond)):
							}
						case reportsCtx.Err() == nil:
							t.Errorf("report: %v", err)
							return
						}
					}
				})
			}
			// Sample the reports in flight under the budget: never more than its one slot.
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				for reportsCtx.Err() == nil {
					if n := int64(fe.budget("reporting").InFlight); n > maxRunning.Load() {
						maxRunning.Store(n)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
			time.Sleep(report) // the reports fill their slot and queue
			ctx, cancel := context.WithTimeout(context.Background(), window)
			var wg sync.WaitGroup
			checkouts(ctx, fe, &beside, &wg)
			checkouts(ctx, twin, &alone, &wg)
			wg.Wait()
			cancel()
			stopReports()
			reports.Wait()
			<-sampled

			ratio := float64(beside.Load()) / float64(alone.Load())
			t.Logf("%s: checkouts %d alone (the twin), %d beside the reports (%.3f); reports done %d, refused %d, at most %d in flight",
				fe.name, alone.Load(), beside.Load(), ratio, done.Load(), refused.Load(), maxRunning.Load())
			want := 0.9
			if fe.name == "Open" {
				want = 0.5
			}
			if ratio < want {
				t.Errorf("checkouts beside the waiting reports: %.3f of alone, want >= %.1f", ratio, want)
			}
			if done.Load() == 0 {
				t.Error("no report completed: throttled into starvation")
			}
			if maxRunning.Load() > 1 {
				t.Errorf("%d reports in flight at once under max_concurrent: 1", maxRunning.Load())
			}
			// One at a time, the reports cannot complete more than the window holds of them.
			if limit := int64((window+2*report)/report) + 1; done.Load() > limit {
				t.Errorf("%d reports completed, more than one at a time allows (%d)", done.Load(), limit)
			}
		})
	}
}

// TestPoolRefusesWithoutAConnection: with the pool's only connection busy, a statement that
// its budget refuses is refused at once, while the busy connection is still busy: the pool
// decides before it takes a connection. Exec, QueryRow and a batch alike.
func TestPoolRefusesWithoutAConnection(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	cfg, err := driver.ParseConfig([]byte(`
budgets:
  - {name: closed, mode: enforce, max_concurrent: 0}
  - {name: slots, mode: enforce, max_concurrent: 1}
rules:
  - {budget: closed, match: {app: closed}}
  - {budget: slots, match: {app: slots}}
`))
	if err != nil {
		t.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 1
	p, err := driver.NewPoolFromConfig(context.Background(), pc, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)

	// The one connection runs a slow statement of the slots budget, which takes its one slot.
	slotsCtx := tagging.With(context.Background(), "app", "slots")
	busy := make(chan error, 1)
	go func() {
		_, err := p.Exec(slotsCtx, "select pg_sleep(3)")
		busy <- err
	}()
	for p.Stat().AcquiredConns() != 1 || poolBudget(t, p, "slots").InFlight != 1 {
		time.Sleep(time.Millisecond)
	}
	closedCtx := tagging.With(context.Background(), "app", "closed")
	var be *driver.BlockedError
	if _, err := p.Exec(closedCtx, "select 1"); !errors.As(err, &be) || be.Reason != driver.ReasonConcurrency {
		t.Fatalf("exec: %v", err)
	}
	if err := p.QueryRow(closedCtx, "select 1").Scan(new(int)); !errors.As(err, &be) {
		t.Fatalf("query row: %v", err)
	}
	b := &pgx.Batch{}
	b.Queue("select 1")
	if err := p.SendBatch(closedCtx, b).Close(); !errors.As(err, &be) {
		t.Fatalf("batch: %v", err)
	}
	// A statement refused for a slot (no max_wait) is refused at once too.
	if _, err := p.Exec(slotsCtx, "select 2"); !errors.As(err, &be) || be.Reason != driver.ReasonConcurrency {
		t.Fatalf("slots: %v", err)
	}
	select {
	case err := <-busy:
		t.Fatalf("the refusals waited for the busy connection (it ended: %v)", err)
	default:
	}
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
}

// TestWaitersAdmittedInArrivalOrder: six statements waiting under max_wait for one slot are
// admitted in the order they arrived, on both front ends. Each inserts its number once admitted;
// with one slot they run one at a time, so the table's serial order is their admission order.
func TestWaitersAdmittedInArrivalOrder(t *testing.T) {
	const rules = `
budgets:
  - {name: q, mode: enforce, max_concurrent: 1, max_wait: 30s, max_queue: 8}
rules:
  - {budget: q, match: {app: q}}
`
	for _, fe := range openFrontEnds(t, rules, 10) {
		t.Run(fe.name, func(t *testing.T) {
			bg := context.Background()
			table := "arrivals_" + fe.name
			if err := fe.exec(bg, fmt.Sprintf("create table %s (seq serial primary key, i int)", table)); err != nil {
				t.Fatal(err)
			}
			ctx := tagging.With(bg, "app", "q")
			// The slot is held by rows left open until the waiters are queued.
			release, err := fe.hold(ctx, "select 1")
			if err != nil {
				t.Fatal(err)
			}
			errs := make(chan error, 6)
			for i := range 6 {
				go func() {
					errs <- fe.exec(ctx, fmt.Sprintf("insert into %s (i) values ($1)", table), i)
				}()
				// The next arrives only once this one waits.
				for deadline := time.Now().Add(10 * time.Second); fe.budget("q").Waiting != i+1; {
					if time.Now().After(deadline) {
						t.Fatalf("waiter %d never queued: %+v", i, fe.budget("q"))
					}
					time.Sleep(time.Millisecond)
				}
			}
			release()
			for range 6 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			order, err := fe.ints(bg, fmt.Sprintf("select i from %s order by seq", table))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(order, []int{0, 1, 2, 3, 4, 5}) {
				t.Fatalf("admitted in order %v, want arrival order", order)
			}
		})
	}
}
