// Command noisy-neighbor is pgtraffic's protection experiment: a critical OLTP workload (point
// selects and single-row updates, tagged app=checkout) and a noisy reporting workload (scans,
// aggregates and hash joins, tagged app=reporting) share one PostgreSQL and one pgtraffic
// connector, in three phases:
//
//  1. solo: the checkout workload alone;
//  2. uncontrolled: with the reporting workload, the reporting budget in mode off;
//  3. controlled: the same reporting workload, the budget in mode enforce (see [budgetRules]).
//
// The three phases run in turn for several rounds (-rounds), and each phase's figures merge its
// rounds, so that load from other programs on the machine falls on all three phases alike
// instead of on whichever happened to run when it came.
//
// It prints the checkout workload's throughput and p50/p99 latency per phase, checks the
// targets (controlled p99 ≤ 1.5× solo p99; uncontrolled p99 ≥ 3× solo p99) and writes a PNG
// chart of the checkout latency over time.
//
//	go run ./examples/noisy-neighbor -out noisy-neighbor.png
//
// Set PGTRAFFIC_TEST_DSN to use an existing server instead of a throwaway one. It exits
// non-zero only on errors, never on a missed target.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// budgetRules is the reporting budget, filled in from the flags. By default: one report at a
// time, and in the long run 15% of one core's execution time (the bucket drains 150 ms of
// execution per second), with a bucket of 2 s, room for the largest report even on a loaded
// machine, where reports run longer. burst_limit must exceed the largest report's predicted
// cost: a report predicted larger is refused outright (per_query_limit, "never fits"), and the
// reports would get none of their share. server_cores stays 1 (the default) on this 2-core machine: the budget gives the
// reports a share of one core and leaves the other to the checkout path.
const budgetRules = `
budgets:
  - name: reporting
    mode: %s
    max_concurrent: %d
    server_share: %g
    burst_limit: %s
rules:
  - budget: reporting
    match: {app: reporting}
`

// The experiment's targets, as multiples of the solo p99.
const (
	targetControlled   = 1.5 // controlled p99 must stay at or below this
	targetUncontrolled = 3.0 // uncontrolled p99 must reach at least this
	targetShare        = 0.9 // under the budget the reports get at least this part of their share
)

type flags struct {
	phase    time.Duration
	rounds   int
	settle   time.Duration
	workers  int
	pool     int
	think    time.Duration
	noise    int
	orders   int
	accounts int
	window   time.Duration
	out      string

	maxConcurrent int
	share         float64
	burst         time.Duration
	parallel      bool
}

// rules is the rules file with the budget in mode (enforce or off).
func (f flags) rules(mode string) string {
	return fmt.Sprintf(budgetRules, mode, f.maxConcurrent, f.share, f.burst)
}

func main() {
	var f flags
	flag.DurationVar(&f.phase, "phase", 4*time.Second, "duration of each phase in each round")
	flag.IntVar(&f.rounds, "rounds", 4, "how often to run the three phases, in turn; each phase's figures merge its rounds")
	flag.DurationVar(&f.settle, "settle", time.Second, "pause between phases, unmeasured, so one phase's stragglers do not count in the next")
	flag.IntVar(&f.workers, "workers", 4, "closed-loop workers of the critical (checkout) workload")
	flag.DurationVar(&f.think, "think", 0, "pause of each checkout worker between statements (0: none, the workers saturate the CPU themselves)")
	flag.IntVar(&f.pool, "pool", 0, "connections in the one pool both workloads share (0: one per worker, so they meet only on the server)")
	flag.IntVar(&f.noise, "noise", 8, "concurrent workers of the noisy (reporting) workload")
	flag.IntVar(&f.orders, "orders", 250_000, "rows of the orders table the reporting queries scan")
	flag.IntVar(&f.accounts, "accounts", 100_000, "rows of the accounts table the checkout workload reads and updates")
	flag.DurationVar(&f.window, "window", 500*time.Millisecond, "width of the chart's latency windows")
	flag.StringVar(&f.out, "out", "noisy-neighbor.png", "where to write the PNG chart")
	flag.IntVar(&f.maxConcurrent, "max-concurrent", 1, "the reporting budget's max_concurrent")
	flag.Float64Var(&f.share, "share", 0.15, "the reporting budget's server_share")
	flag.DurationVar(&f.burst, "burst", 2*time.Second, "the reporting budget's burst_limit")
	flag.BoolVar(&f.parallel, "parallel", false, "let PostgreSQL run the reports with parallel workers (see README)")
	flag.Parse()
	if err := f.validate(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		flag.Usage()
		os.Exit(2)
	}
	if err := run(f); err != nil {
		log.Fatal(err)
	}
}

func (f flags) validate() error {
	switch {
	case f.phase < time.Second:
		return errors.New("noisy-neighbor: -phase must be at least 1s")
	case f.rounds < 1:
		return errors.New("noisy-neighbor: -rounds must be at least 1")
	case f.settle < 0:
		return errors.New("noisy-neighbor: -settle must not be negative")
	case f.workers < 1:
		return errors.New("noisy-neighbor: -workers must be at least 1")
	case f.think < 0:
		return errors.New("noisy-neighbor: -think must not be negative")
	case f.pool < 0:
		return errors.New("noisy-neighbor: -pool must not be negative")
	case f.noise < 1:
		return errors.New("noisy-neighbor: -noise must be at least 1")
	case f.orders < 1000 || f.accounts < 1000:
		return errors.New("noisy-neighbor: -orders and -accounts must be at least 1000")
	case f.window < 10*time.Millisecond:
		return errors.New("noisy-neighbor: -window must be at least 10ms")
	case f.maxConcurrent < 1:
		return errors.New("noisy-neighbor: -max-concurrent must be at least 1")
	case f.share <= 0 || f.share > 1:
		return errors.New("noisy-neighbor: -share must be in (0, 1]")
	case f.burst < time.Millisecond:
		return errors.New("noisy-neighbor: -burst must be at least 1ms")
	case f.out == "":
		return errors.New("noisy-neighbor: -out must name a file")
	}
	return nil
}

func run(f flags) error {
	ctx := context.Background()
	dsn, stop, err := pgtest.EnvOrStart()
	if err != nil {
		return err
	}
	defer stop()
	if !f.parallel {
		// The budget counts execution seconds of one backend; parallel workers would let one
		// report occupy every core of this small server while being charged for one.
		var err error
		if dsn, err = withRuntimeParam(dsn, "options", "-c max_parallel_workers_per_gather=0"); err != nil {
			return err
		}
	}
	// The same rules in every phase; only the controlled phase turns the budget on.
	enforce, err := driver.ParseConfig([]byte(f.rules("enforce")))
	if err != nil {
		return err
	}
	off, err := driver.ParseConfig([]byte(f.rules("off")))
	if err != nil {
		return err
	}
	// Only blocks are logged, as warnings; the table counts them, so the log stays quiet.
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	c, err := driver.NewConnector(dsn, driver.WithConfig(off), driver.WithLogger(quiet))
	if err != nil {
		return err
	}
	db := sql.OpenDB(c)
	defer db.Close()
	// By default a pool with room for every worker, kept open, so that no phase pays for new
	// connections and the workloads meet only on the server.
	conns := f.workers + f.noise + 2
	if f.pool > 0 {
		conns = f.pool
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)

	fmt.Printf("loading %d orders and %d accounts ...\n", f.orders, f.accounts)
	if err := setup(ctx, db, f.orders, f.accounts); err != nil {
		return err
	}

	ex := newExperiment(db, f)
	var runs []phaseSpec
	for round := 1; round <= f.rounds; round++ {
		runs = append(runs,
			phaseSpec{name: "solo", round: round, config: off},
			phaseSpec{name: "uncontrolled", round: round, noise: true, config: off},
			phaseSpec{name: "controlled", round: round, noise: true, config: enforce})
	}
	fmt.Printf("running %d round(s) of 3 phases of %v: %d checkout workers, %d reporting workers\n",
		f.rounds, f.phase, f.workers, f.noise)
	res, err := ex.run(ctx, c, runs)
	if err != nil {
		return err
	}

	fmt.Println()
	printTable(os.Stdout, res)
	fmt.Println()
	printTargets(os.Stdout, res, f.share, f.burst, f.phase)
	for _, b := range c.Snapshot().Budgets {
		fmt.Printf("\nbudget %s (%s, max_concurrent %d, server_share %g, burst_limit %v): admitted %d, blocked %d\n",
			b.Name, b.Mode, f.maxConcurrent, f.share, f.burst, b.Admitted, b.Blocked)
	}

	if err := writeChart(f.out, res, f.window); err != nil {
		return err
	}
	fmt.Printf("\nchart written to %s\n", f.out)
	return nil
}

// withRuntimeParam adds a run-time parameter to a PostgreSQL URL or keyword/value DSN.
func withRuntimeParam(dsn, key, value string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("noisy-neighbor: PGTRAFFIC_TEST_DSN: %w", err)
		}
		q := u.Query()
		q.Set(key, value)
		// pgx decodes %20 but not '+' as a space.
		u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
		return u.String(), nil
	}
	quoted := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(value)
	return fmt.Sprintf("%s %s='%s'", dsn, key, quoted), nil
}
