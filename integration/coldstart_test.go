package integration

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
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
