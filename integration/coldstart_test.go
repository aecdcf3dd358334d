package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// openCold opens, with driver.Open, a fresh database whose every statement is under the
// enforce budget spec (a flow mapping's fields) on a server of cores, in a process that has
// seen none of its patterns. setup runs first on a plain pgx connection, outside pgtraffic.
// A test's statements are all in flight together: the budget is generous only if the rate
// (share × cores) covers them, since on a loaded machine each takes far longer than alone.
func openCold(t *testing.T, cores int, spec string, setup ...string) *sql.DB {
	t.Helper()
	dsn := pgtest.Shared(t).CreateDatabase(t)
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, q := range setup {
		if _, err := raw.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	pc, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := driver.ParseConfig(fmt.Appendf(nil, `
server_cores: %d
budgets:
  - {name: all, mode: enforce, %s}
rules:
  - {budget: all, match: {database: %s}}
`, cores, spec, strconv.Quote(pc.Database)))
	if err != nil {
		t.Fatal(err)
	}
	db, err := driver.Open(dsn, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestColdStartGenerousBudget: a deploy, 16 requests at once each running 12 statements of
// patterns the process has never seen, under a generous enforce budget: nothing is refused.
func TestColdStartGenerousBudget(t *testing.T) {
	const requests, patterns = 16, 12
	setup := make([]string, patterns)
	for j := range setup {
		setup[j] = fmt.Sprintf("create table cold_%d (id int primary key)", j)
	}
	db := openCold(t, 2*requests, "max_concurrent: 100, server_share: 1, burst_limit: 10s", setup...)
	db.SetMaxOpenConns(requests)
	start := make(chan struct{})
	errs := make(chan error, requests*patterns)
	var wg sync.WaitGroup
	for r := range requests {
		wg.Go(func() {
			<-start
			for j := range patterns {
				// The sleep keeps every request's statement of one pattern in flight together.
				q := fmt.Sprintf("select pg_sleep(0.01), count(*) from cold_%d where id <> $1", j)
				if _, err := db.ExecContext(context.Background(), q, r); err != nil {
					errs <- fmt.Errorf("request %d, pattern %d: %w", r, j, err)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestConnConcurrencyUnderEnforce is pgx's stdlib TestConnConcurrency run through pgtraffic
// with every statement under an enforce budget that its known costs never fill (no
// max_concurrent, a rate above the 50 statements in flight): 50 goroutines at once insert and update rows of their own, then read them
// back, all on patterns the process has never seen.
func TestConnConcurrencyUnderEnforce(t *testing.T) {
	db := openCold(t, 100, "server_share: 1, burst_limit: 10s", "create table t (id integer primary key, str text, dur_str interval)")
	const concurrency = 50
	run := func(f func(ctx context.Context, i int) error) {
		t.Helper()
		errs := make(chan error, concurrency)
		var wg sync.WaitGroup
		for i := 1; i <= concurrency; i++ {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if err := f(ctx, i); err != nil {
					errs <- fmt.Errorf("goroutine %d: %w", i, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	run(func(ctx context.Context, i int) error {
		if _, err := db.ExecContext(ctx, "insert into t values($1)", i); err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		if _, err := db.ExecContext(ctx, "update t set str = $1 where id = $2", strconv.Itoa(i), i); err != nil {
			return fmt.Errorf("update str: %w", err)
		}
		if _, err := db.ExecContext(ctx, "update t set dur_str = $1 where id = $2", time.Duration(i)*time.Second, i); err != nil {
			return fmt.Errorf("update dur_str: %w", err)
		}
		return nil
	})
	run(func(ctx context.Context, i int) error {
		var id int
		var str string
		var dur pgtype.Interval
		if err := db.QueryRowContext(ctx, "select id, str, dur_str from t where id = $1", i).Scan(&id, &str, &dur); err != nil {
			return fmt.Errorf("select: %w", err)
		}
		want := pgtype.Interval{Microseconds: int64(i) * time.Second.Microseconds(), Valid: true}
		if id != i || str != strconv.Itoa(i) || dur != want {
			return fmt.Errorf("read back %d %q %v, want %d %q %v", id, str, dur, i, strconv.Itoa(i), want)
		}
		return nil
	})
}

// TestSlowStartPatternIsProbed: a pattern whose first execution ran slow (300ms, three times
// the budget's 100ms burst) is refused as never fitting, but not for good: after cost.Relearn
// one statement runs as a probe. A pattern that is in fact cheap (pg_sleep(0)) is admitted
// again from then on; one that is not (pg_sleep(0.3) again) has its probe cancelled at the
// burst, with an error matching driver.ErrOverrun, and is refused after it. On both front
// ends; nothing is timed: the test waits for each outcome, up to four Relearn. (The burst is
// wide enough that the cheap statement, measured on the client's clock, stays within it on a
// machine loaded with -race and other tests.)
func TestSlowStartPatternIsProbed(t *testing.T) {
	const spec = "server_share: 0.1, burst_limit: 100ms"
	t.Run("database/sql", func(t *testing.T) {
		t.Parallel()
		db := openCold(t, 1, spec)
		db.SetMaxOpenConns(2)
		probeScenario(t, func(ctx context.Context, q string, arg float64) error {
			_, err := db.ExecContext(ctx, q, arg)
			return err
		})
	})
	t.Run("pgx-native pool", func(t *testing.T) {
		t.Parallel()
		p, _ := openPool(t, `
server_cores: 1
budgets:
  - {name: all, mode: enforce, `+spec+`}
rules:
  - {budget: all, match: {app: probed}}
`)
		tagged := tagging.With(context.Background(), "app", "probed")
		probeScenario(t, func(_ context.Context, q string, arg float64) error {
			_, err := p.Exec(tagged, q, arg)
			return err
		})
		if n := p.Snapshot().Counters.Probes; n < 2 {
			t.Errorf("%d probes counted, want one of each pattern at least", n)
		}
	})
}

// probeScenario is TestSlowStartPatternIsProbed on one front end, whose statements exec runs.
func probeScenario(t *testing.T, exec func(ctx context.Context, q string, arg float64) error) {
	ctx := context.Background()
	const cheap, costly = "select pg_sleep($1::float8)", "select pg_sleep($1::float8), 2"
	for _, q := range []string{cheap, costly} { // a cold start each: admitted once there is room
		for {
			err := exec(ctx, q, 0.3)
			var b *driver.BlockedError
			if errors.As(err, &b) && b.Reason == driver.ReasonBudget {
				time.Sleep(b.RetryAfter)
				continue
			}
			if err != nil {
				t.Fatalf("%s, first: %v", q, err)
			}
			break
		}
	}
	neverFits := func(err error) bool {
		var b *driver.BlockedError
		return errors.As(err, &b) && b.Reason == driver.ReasonPerQuery && b.RetryAfter == 0
	}
	for _, q := range []string{cheap, costly} {
		if err := exec(ctx, q, 0); !neverFits(err) {
			t.Fatalf("%s after a 300ms first run: %v, want refused as never fitting", q, err)
		}
	}
	deadline := time.Now().Add(4 * cost.Relearn)
	var cheapBack, costlyCut bool
	for !(cheapBack && costlyCut) && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		if !cheapBack {
			switch err := exec(ctx, cheap, 0); {
			case err == nil:
				cheapBack = true
				// Admitted from now on: a statement may wait for the bucket (reason budget, the
				// probe's cost charged), never be refused as never fitting.
				for i := 0; i < 5; {
					err := exec(ctx, cheap, 0)
					var b *driver.BlockedError
					switch {
					case errors.As(err, &b) && b.Reason == driver.ReasonBudget:
						time.Sleep(b.RetryAfter)
					case err != nil:
						t.Fatalf("statement %d after the cheap pattern's probe: %v", i, err)
					default:
						i++
					}
				}
			case !errors.Is(err, driver.ErrBlocked):
				t.Fatalf("the cheap pattern: %v", err)
			}
		}
		if !costlyCut {
			switch err := exec(ctx, costly, 0.3); {
			case err == nil:
				t.Fatal("the costly pattern's probe ran past the burst and was not cancelled")
			case errors.Is(err, driver.ErrOverrun):
				costlyCut = true
				if err := exec(ctx, costly, 0); !neverFits(err) {
					t.Fatalf("the costly pattern after its probe was cut off: %v, want refused as never fitting", err)
				}
			case !errors.Is(err, driver.ErrBlocked):
				t.Fatalf("the costly pattern: %v", err)
			}
		}
	}
	if !cheapBack || !costlyCut {
		t.Fatalf("after %v: the cheap pattern admitted again %v, the costly one's probe cut off %v", 4*cost.Relearn, cheapBack, costlyCut)
	}
}

// TestColdStartAfterTrivialStatements: a deploy whose first statements are trivial (a
// connection check, a session setting: planner cost 0.01, a round trip each), then a new
// pattern of a modest plan (cost about 125, about a millisecond), under per_query_limit: 1s.
// The trivial statements' time is their fixed cost, not their plan: it must not teach the
// model that a planner unit costs a round trip's hundredth (which predicted the new pattern
// at seconds, and refused it as too costly).
func TestColdStartAfterTrivialStatements(t *testing.T) {
	db := openCold(t, 2, "per_query_limit: 1s")
	ctx := context.Background()
	var n int
	for i := range 300 {
		if err := db.QueryRowContext(ctx, "select 1 + $1::int", i).Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	const modest = "select count(*) from pg_attribute a join pg_class c on a.attrelid = c.oid where c.oid > $1"
	for i := range 5 {
		if err := db.QueryRowContext(ctx, modest, i).Scan(&n); err != nil {
			t.Fatalf("execution %d of a new pattern of a modest plan: %v", i, err)
		}
	}
}
