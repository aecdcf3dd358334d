// Command demo shows pgtraffic on a throwaway PostgreSQL: a reporting budget that blocks a burst
// and recovers after RetryAfter, a never-seen enormous query refused by its predicted cost, a
// DELETE without WHERE stopped by a guard, and the budget's state and learned patterns. With -v
// it also logs each statement's fingerprint, normalised text and tags at DEBUG level.
//
//	make demo                  # or: go run ./examples/demo
//	go run ./examples/demo -v  # and a DEBUG line per statement
//
// Set PGTRAFFIC_TEST_DSN to use an existing server instead of a throwaway one.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

const rules = `
server_cores: 1
budgets:
  - name: reporting
    mode: enforce
    max_concurrent: 2
    per_query_limit: 2s
    server_share: 0.05      # 5% of one core in the long run: the bucket drains 50ms per second
    burst_limit: 300ms      # at most 300ms of execution in a burst
rules:
  - budget: reporting
    match: {app: reporting}
guards:
  require_where: enforce
`

func main() {
	verbose := flag.Bool("v", false, "log each statement's fingerprint, normalised text and tags (DEBUG)")
	flag.Parse()
	if err := run(newLogger(os.Stdout, *verbose)); err != nil {
		log.Fatal(err)
	}
}

// newLogger returns the demo's logger: pgtraffic's warnings and notices, and with verbose one
// DEBUG line per statement too. Timestamps are left out so the output reads as a story.
func newLogger(w io.Writer, verbose bool) *slog.Logger {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}))
}

func run(logger *slog.Logger) error {
	ctx := context.Background()
	dsn, stop, err := pgtest.EnvOrStart()
	if err != nil {
		return err
	}
	defer stop()
	cfg, err := driver.ParseConfig([]byte(rules))
	if err != nil {
		return err
	}
	c, err := driver.NewConnector(dsn, driver.WithConfig(cfg), driver.WithLogger(logger))
	if err != nil {
		return err
	}
	db := sql.OpenDB(c)
	defer db.Close()

	section("1. Setup (untagged statements: no budget applies)")
	if err := enableServerClock(ctx, db); err != nil {
		fmt.Printf("pg_stat_statements not created (%v): costs stay on the client's clock\n", err)
	}
	for _, q := range []string{
		`drop table if exists orders, big_a, big_b`,
		`create table orders (id int primary key, customer int, amount numeric, created timestamptz)`,
		`insert into orders select g, g % 1000, (g % 97) * 1.5, now() - g * interval '1 minute' from generate_series(1, 200000) g`,
		`create table big_a as select g as id from generate_series(1, 200000) g`,
		`create table big_b as select g as id from generate_series(1, 200000) g`,
		`analyze`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	var n int
	if err := db.QueryRowContext(ctx, `select count(*) from orders where customer = $1`, 7).Scan(&n); err != nil {
		return err
	}
	fmt.Printf("orders of customer 7: %d\n", n)

	section("2. A reporting burst meets its bucket (burst_limit 300ms, drains 50ms/s)")
	reporting := tagging.With(ctx, "app", "reporting", "controller", "daily")
	report := func() (total float64, err error) {
		err = db.QueryRowContext(reporting, `select sum(amount) from orders where created > now() - interval '100 days'`).Scan(&total)
		return total, err
	}
	var blockedErr *driver.BlockedError
	for i := 1; i <= 30; i++ {
		total, err := report()
		if errors.As(err, &blockedErr) {
			fmt.Printf("query %d: BLOCKED: %v\n", i, err)
			break
		}
		if err != nil {
			return err
		}
		fmt.Printf("query %d: ok (sum %.0f)\n", i, total)
	}
	if blockedErr == nil {
		fmt.Println("the bucket never filled (a very fast machine); the block below still shows")
	}
	// What a client does with a refusal: wait its RetryAfter and try again. A later refusal
	// can come, with a RetryAfter of its own: the bucket is trued up by what the server reports
	// the last reports cost, which RetryAfter could not know.
	for tries := 0; blockedErr != nil && tries < 5; tries++ {
		if blockedErr.RetryAfter == 0 {
			// A report predicted to cost more than the whole burst_limit (a slow or busy
			// machine) never fits: RetryAfter 0 says waiting cannot help.
			fmt.Println("RetryAfter = 0: this machine ran the report longer than the whole burst_limit, so waiting cannot help")
			break
		}
		fmt.Printf("waiting RetryAfter = %v ...\n", blockedErr.RetryAfter.Round(time.Millisecond))
		time.Sleep(blockedErr.RetryAfter)
		switch _, err := report(); {
		case err == nil:
			fmt.Println("after RetryAfter: ok, the budget recovered")
			blockedErr = nil
		case !errors.As(err, &blockedErr):
			return fmt.Errorf("after RetryAfter: %w", err)
		}
	}
	if blockedErr != nil && blockedErr.RetryAfter > 0 {
		fmt.Printf("still refused after five waits (the server reported each report costlier than predicted): %v\n", blockedErr)
	}

	section("3. A never-seen enormous query is refused by its predicted cost (per_query_limit 2s)")
	start := time.Now()
	_, err = db.ExecContext(reporting, `select count(*) from big_a cross join big_b`)
	fmt.Printf("cross join of 200k x 200k rows: %v\n(decided in %v, nothing ran on the server)\n", err, time.Since(start).Round(time.Millisecond))

	section("4. A DELETE without a real WHERE is stopped by the require_where guard")
	_, err = db.ExecContext(ctx, `delete from orders where 1 = 1`)
	fmt.Printf("delete from orders where 1 = 1: %v\n", err)
	if err := db.QueryRowContext(ctx, `select count(*) from orders`).Scan(&n); err != nil {
		return err
	}
	fmt.Printf("orders still has %d rows\n", n)

	section("5. Budget state and the patterns pgtraffic learned")
	snap := c.Snapshot()
	for _, b := range snap.Budgets {
		fmt.Printf("budget %s (%s): debt %.3fs, in flight %d, admitted %d, blocked %d\n",
			b.Name, b.Mode, b.Debt, b.InFlight, b.Admitted, b.Blocked)
	}
	// Each statement is known by its pattern: the fingerprint of its normalised text.
	for _, p := range snap.Patterns[:min(len(snap.Patterns), 4)] {
		if p.Count == 0 { // priced by its plan, never run
			fmt.Printf("pattern %s: never run, predicted %.3fs: %.70s\n", p.Fingerprint, p.MeanCost, p.Query)
			continue
		}
		fmt.Printf("pattern %s: %d run(s), mean %.3fs: %.70s\n", p.Fingerprint, p.Count, p.MeanCost, p.Query)
	}
	if logger.Enabled(ctx, slog.LevelDebug) {
		return nil
	}
	fmt.Println("(go run ./examples/demo -v logs every statement's fingerprint, normalised text and tags)")
	return nil
}

// enableServerClock creates pg_stat_statements in the demo's database when the server preloads
// the module (the throwaway server does), so that pgtraffic reads each pattern's execution time
// on the server's clock, as in production. Elsewhere it creates nothing: pgtraffic then logs once
// that reading the server's clock failed, and costs stay on the client's clock.
func enableServerClock(ctx context.Context, db *sql.DB) error {
	var loaded bool
	err := db.QueryRowContext(ctx, `select 'pg_stat_statements' = any(string_to_array(
		replace(current_setting('shared_preload_libraries'), ' ', ''), ','))`).Scan(&loaded)
	if err != nil || !loaded {
		return err
	}
	_, err = db.ExecContext(ctx, `create extension if not exists pg_stat_statements`)
	return err
}

func section(title string) {
	fmt.Printf("\n== %s %s\n", title, strings.Repeat("=", max(0, 90-len(title))))
}
