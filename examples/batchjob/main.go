// Command batchjob is a chunked bulk import that yields to the server's health: before each
// chunk it asks pgtraffic whether the server is healthy enough ([driver.Connector.Check]) and,
// if not, waits until it is ([driver.Connector.Wait]), instead of being refused mid-way.
//
// It starts a throwaway PostgreSQL, creates a table, and imports -chunks chunks of -rows rows
// under the budget
//
//	{name: batch, mode: enforce, throttle_when: {active_queries: 4}}
//
// selected by the tag job=import. Twice during the import a background "load" of -load
// sessions outside pgtraffic runs pg_sleep for -load-for, so the server has more active queries
// than the budget allows; the import waits each time and resumes when the load ends. It prints
// per chunk whether it waited, and at the end how often and how long it waited in total.
//
//	go run ./examples/batchjob
//
// Set PGTRAFFIC_TEST_DSN to use an existing server instead of a throwaway one (its role needs
// pg_read_all_stats to see other sessions' queries).
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// rules throttle the import while 4 or more queries are active on the server. The short
// health_interval keeps the example quick; 1s (the default) suits production.
const rules = `
health_interval: 250ms
budgets:
  - {name: batch, mode: enforce, throttle_when: {active_queries: 4}}
rules:
  - {budget: batch, match: {job: import}}
`

// loadApp is the application_name of the load's sessions.
const loadApp = "batchjob-load"

type flags struct {
	chunks   int
	rows     int
	parse    time.Duration
	load     int
	loadFor  time.Duration
	loadAt   [2]int
	showLogs bool
}

func main() {
	var f flags
	flag.IntVar(&f.chunks, "chunks", 50, "chunks to import")
	flag.IntVar(&f.rows, "rows", 1000, "rows per chunk")
	flag.DurationVar(&f.parse, "parse", 80*time.Millisecond, "time spent reading and parsing each chunk of input")
	flag.IntVar(&f.load, "load", 6, "sessions in each burst of background load")
	flag.DurationVar(&f.loadFor, "load-for", 2*time.Second, "how long each burst of load runs")
	flag.BoolVar(&f.showLogs, "logs", false, "print pgtraffic's log (warnings and blocks) to stderr")
	flag.Parse()
	if f.chunks < 1 || f.rows < 1 || f.load < 0 || f.parse < 0 || f.loadFor < 0 {
		fmt.Fprintln(os.Stderr, "batchjob: -chunks and -rows must be positive; -load, -parse and -load-for not negative")
		flag.Usage()
		os.Exit(2)
	}
	f.loadAt = [2]int{f.chunks / 5, f.chunks * 3 / 5} // two bursts: at 20% and 60% of the import
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, f); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, f flags) error {
	dsn, stop, err := pgtest.EnvOrStart()
	if err != nil {
		return err
	}
	defer stop()
	cfg, err := driver.ParseConfig([]byte(rules))
	if err != nil {
		return err
	}
	logLevel := slog.Level(100) // nothing: the example prints its own account of each chunk
	if f.showLogs {
		logLevel = slog.LevelInfo
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel}))
	opened := time.Now()
	c, err := driver.NewConnector(dsn, driver.WithConfig(cfg), driver.WithLogger(logger))
	if err != nil {
		return err
	}
	db := sql.OpenDB(c)
	defer db.Close()

	// Untagged statements are in no budget: setup is never throttled.
	for _, q := range []string{
		`drop table if exists batchjob_import`,
		`create table batchjob_import (id bigint primary key, name text not null, amount_cents bigint not null)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return err
		}
	}

	job := tagging.With(ctx, "job", "import")
	// Wait before the first chunk as before every other: it returns once the budget admits the
	// job (at once while the server is quiet; a metric with no reading yet holds nothing back
	// for its first three intervals, and a stale one then counts as exceeded).
	if err := c.Wait(job); err != nil {
		return err
	}
	fmt.Printf("first Wait returned %v after the connector opened\n", time.Since(opened).Round(time.Millisecond))

	var loads sync.WaitGroup
	defer loads.Wait()
	var stats struct {
		waits, blocked int
		waited         time.Duration
	}
	start := time.Now()
	for chunk := 1; chunk <= f.chunks; chunk++ {
		if f.load > 0 && (chunk == f.loadAt[0] || chunk == f.loadAt[1]) {
			loads.Add(1)
			go func() {
				defer loads.Done()
				if err := runLoad(ctx, dsn, f.load, f.loadFor); err != nil {
					fmt.Printf("load: %v\n", err)
				}
			}()
		}
		ids, names, amounts := readChunk(chunk, f.rows, f.parse)
		for {
			waited, err := waitHealthy(job, c, func(why string) {
				fmt.Printf("chunk %2d/%d: server busy (%s); waiting ...\n", chunk, f.chunks, why)
			})
			if err != nil {
				return err
			}
			if waited > 0 {
				stats.waits++
				stats.waited += waited
			}
			_, err = db.ExecContext(job,
				`insert into batchjob_import (id, name, amount_cents)
				 select * from unnest($1::bigint[], $2::text[], $3::bigint[])`, ids, names, amounts)
			var be *driver.BlockedError
			if errors.As(err, &be) {
				// The server got busy between Wait and the insert. Nothing was sent; wait again.
				stats.blocked++
				fmt.Printf("chunk %2d/%d: blocked after Wait (%s); waiting again\n", chunk, f.chunks, be.Limit)
				continue
			}
			if err != nil {
				return fmt.Errorf("chunk %d: %w", chunk, err)
			}
			if waited > 0 {
				fmt.Printf("chunk %2d/%d: imported after waiting %v\n", chunk, f.chunks, waited.Round(time.Millisecond))
			} else {
				fmt.Printf("chunk %2d/%d: imported\n", chunk, f.chunks)
			}
			break
		}
	}
	elapsed := time.Since(start)

	var rows int
	if err := db.QueryRowContext(ctx, `select count(*) from batchjob_import`).Scan(&rows); err != nil {
		return err
	}
	fmt.Printf("\nimported %d rows in %d chunks in %v\n", rows, f.chunks, elapsed.Round(time.Millisecond))
	fmt.Printf("waited before %d chunks, %v in total\n", stats.waits, stats.waited.Round(time.Millisecond))
	if stats.blocked > 0 {
		fmt.Printf("%d inserts were blocked after Wait (the server got busy in between) and retried\n", stats.blocked)
	}
	return nil
}

// waitHealthy returns at once if the budget admits the job now. Otherwise it calls waiting with
// the reason, waits until the budget admits the job (or ctx ends) and returns how long it waited.
func waitHealthy(ctx context.Context, c *driver.Connector, waiting func(why string)) (time.Duration, error) {
	err := c.Check(ctx)
	if err == nil {
		return 0, nil
	}
	var be *driver.BlockedError
	if !errors.As(err, &be) {
		return 0, err
	}
	waiting(be.Reason + ": " + be.Limit)
	start := time.Now()
	// Wait re-checks with jittered backoff, so that many jobs waiting on one server do not
	// all resume at the instant a metric drops.
	if err := c.Wait(ctx); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// readChunk stands for reading and parsing one chunk of the input file.
func readChunk(chunk, rows int, parse time.Duration) (ids []int64, names []string, amounts []int64) {
	time.Sleep(parse)
	first := int64(chunk-1) * int64(rows)
	for i := range int64(rows) {
		id := first + i + 1
		ids = append(ids, id)
		names = append(names, fmt.Sprintf("customer-%d", id))
		amounts = append(amounts, id*37%100_000)
	}
	return ids, names, amounts
}

// runLoad runs n sessions of pg_sleep for d on plain pgx connections, outside pgtraffic: load
// from other applications, which pgtraffic sees only through the server's health.
func runLoad(ctx context.Context, dsn string, n int, d time.Duration) error {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.RuntimeParams["application_name"] = loadApp
	fmt.Printf("load: %d sessions of pg_sleep(%.1f) start\n", n, d.Seconds())
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.ConnectConfig(ctx, cfg.Copy())
			if err != nil {
				errs[i] = err
				return
			}
			defer conn.Close(context.Background())
			_, errs[i] = conn.Exec(ctx, "select pg_sleep($1)", d.Seconds())
		}()
	}
	wg.Wait()
	fmt.Println("load: ended")
	return errors.Join(errs...)
}
