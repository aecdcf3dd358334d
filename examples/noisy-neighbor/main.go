// Command noisy-neighbor is pgtraffic's protection experiment: a critical OLTP workload (point
// selects and single-row updates, tagged app=checkout) and a noisy reporting workload (scans,
// aggregates and hash joins, tagged app=reporting) share one PostgreSQL. The checkout workload
// always runs through one pgtraffic connector; the reports run in turn in each of five arms, the
// controls a team would reach for first beside pgtraffic:
//
//  1. solo: no reports, the checkout workload alone (the yardstick);
//  2. uncontrolled: the reports on their own *sql.DB, unlimited;
//  3. one-conn: the reports on their own *sql.DB capped at one open connection
//     (SetMaxOpenConns(1));
//  4. timeout: the reports on their own *sql.DB whose connections set statement_timeout to the
//     budget's per_query_limit;
//  5. pgtraffic: the reports on the checkout's own pool, a *sql.DB from one pgtraffic connector
//     sized as an application sizes it (a few connections above the checkout workers), under
//     the budget of [budgetRules]; a report worker asks the connector's Check before it takes
//     a connection, as a batch job on database/sql does.
//
// Each round runs every arm once, in an order that rotates from round to round (-rounds), and
// each arm's figures merge its rounds, so that load from other programs on the machine falls on
// all arms alike instead of on whichever happened to run when it came.
//
// It prints one table (per arm: the checkout throughput and p99, the p99 over the solo p99, the
// reports completed, the most connections the reports held at once, and their execution seconds
// per second, also as a part of the budget's share), checks the targets and writes a PNG chart of the checkout latency over time.
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
	"io"
	"log"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// budgetRules is the reporting budget, filled in from the flags. By default: one report at a
// time, the others waiting up to 2 s for their turn (max_wait) rather than being refused at
// once; none predicted above 1 s; and in the long run 15% of one core's execution time (the
// bucket drains 150 ms of execution per second), with a bucket of 1 s. burst_limit must exceed
// the largest report's predicted cost, which grows on a loaded machine: a report predicted above
// it never fits and is refused outright (per_query_limit), and the reports would get none of
// their share. server_cores stays 1 (the default) on this 2-core machine: the budget gives the
// reports a share of one core and leaves the other to the checkout path.
const budgetRules = `
budgets:
  - name: reporting
    mode: enforce
    max_concurrent: %d
    per_query_limit: %s
    server_share: %g
    burst_limit: %s
    max_wait: %s
rules:
  - budget: reporting
    match: {app: reporting}
`

// The experiment's targets, as multiples of the solo p99 and parts of the budget's share.
const (
	targetControlled   = 1.5 // pgtraffic's p99 must stay at or below this
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
	perQuery      time.Duration
	share         float64
	burst         time.Duration
	maxWait       time.Duration
	parallel      bool

	// untilShown (tests only) ends each arm as soon as it has shown what it stands for (see
	// [armShown]), phase becoming only the limit, so that a slow machine takes longer instead
	// of failing.
	untilShown bool
}

// rules is the rules file of the reporting budget.
func (f flags) rules() string {
	return fmt.Sprintf(budgetRules, f.maxConcurrent, f.perQuery, f.share, f.burst, f.maxWait)
}

// poolSize is the number of connections of the application's pool, which the checkout workers
// and the pgtraffic arm's reports share: -pool, or the checkout workers plus what the budget
// lets the reports hold at once under database/sql, max_concurrent running and as many again
// waiting (max_queue, whose default is max_concurrent).
func (f flags) poolSize() int {
	if f.pool > 0 {
		return f.pool
	}
	return f.workers + 2*f.maxConcurrent
}

func main() {
	var f flags
	flag.DurationVar(&f.phase, "phase", 4*time.Second, "duration of each arm in each round")
	flag.IntVar(&f.rounds, "rounds", 4, "how often to run every arm, in a rotating order; each arm's figures merge its rounds")
	flag.DurationVar(&f.settle, "settle", time.Second, "pause between arms, unmeasured, once the server runs no report, so one arm's stragglers do not count in the next")
	flag.IntVar(&f.workers, "workers", 4, "closed-loop workers of the critical (checkout) workload")
	flag.DurationVar(&f.think, "think", 0, "pause of each checkout worker between statements (0: none, the workers saturate the CPU themselves)")
	flag.IntVar(&f.pool, "pool", 0, "connections in the application's pool that the checkout and the pgtraffic arm's reports share (0: -workers + 2 × -max-concurrent)")
	flag.IntVar(&f.noise, "noise", 8, "concurrent workers of the noisy (reporting) workload")
	flag.IntVar(&f.orders, "orders", 250_000, "rows of the orders table the reporting queries scan")
	flag.IntVar(&f.accounts, "accounts", 100_000, "rows of the accounts table the checkout workload reads and updates")
	flag.DurationVar(&f.window, "window", 500*time.Millisecond, "width of the chart's latency windows")
	flag.StringVar(&f.out, "out", "noisy-neighbor.png", "where to write the PNG chart")
	flag.IntVar(&f.maxConcurrent, "max-concurrent", 1, "the reporting budget's max_concurrent")
	flag.DurationVar(&f.perQuery, "per-query", time.Second, "the reporting budget's per_query_limit, and the timeout arm's statement_timeout")
	flag.Float64Var(&f.share, "share", 0.15, "the reporting budget's server_share")
	flag.DurationVar(&f.burst, "burst", time.Second, "the reporting budget's burst_limit")
	flag.DurationVar(&f.maxWait, "max-wait", 2*time.Second, "the reporting budget's max_wait: how long a report waits for its turn before it is refused")
	flag.BoolVar(&f.parallel, "parallel", false, "let PostgreSQL run the reports with parallel workers (see README)")
	flag.Parse()
	if err := f.validate(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		flag.Usage()
		os.Exit(2)
	}
	if _, err := run(context.Background(), f, os.Stdout); err != nil {
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
	case f.perQuery < time.Millisecond || f.perQuery%time.Millisecond != 0:
		return errors.New("noisy-neighbor: -per-query must be a whole number of milliseconds, at least 1ms (statement_timeout counts milliseconds)")
	case f.share <= 0 || f.share > 1:
		return errors.New("noisy-neighbor: -share must be in (0, 1]")
	case f.burst < time.Millisecond:
		return errors.New("noisy-neighbor: -burst must be at least 1ms")
	case f.maxWait < 0:
		return errors.New("noisy-neighbor: -max-wait must not be negative")
	case f.out == "":
		return errors.New("noisy-neighbor: -out must name a file")
	}
	return nil
}

// run runs the experiment, printing its progress, table and verdicts to w, and returns its
// results.
func run(ctx context.Context, f flags, w io.Writer) (*results, error) {
	// Other programs' load shrinks every ratio: the solo p99 carries it too.
	laStart := loadAverage()
	dsn, stop, err := pgtest.EnvOrStart()
	if err != nil {
		return nil, err
	}
	defer stop()
	if !f.parallel {
		// The budget counts execution seconds of one backend; parallel workers would let one
		// report occupy every core of this small server while being charged for one.
		var err error
		if dsn, err = withRuntimeParam(dsn, "options", "-c max_parallel_workers_per_gather=0"); err != nil {
			return nil, err
		}
	}
	cfg, err := driver.ParseConfig([]byte(f.rules()))
	if err != nil {
		return nil, err
	}
	// Only blocks are logged, as warnings; the table counts them, so the log stays quiet.
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	// Every connection of the application carries the tracer that starts a report's execution
	// clock: set on its ConnConfig, it stays off pgtraffic's own connections.
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("noisy-neighbor: %w", err)
	}
	cc.Tracer = execTracer{}
	c, err := driver.NewConnectorFromConfig(cc, driver.WithConfig(cfg), driver.WithLogger(quiet))
	if err != nil {
		return nil, err
	}
	// The application's pool, sized as an application sizes it: a few connections above its
	// checkout workers, kept open so that no arm pays for new ones. The pgtraffic arm's reports
	// share it: the budget must keep them from taking the checkout's connections.
	db := sql.OpenDB(c)
	defer db.Close()
	db.SetMaxOpenConns(f.poolSize())
	db.SetMaxIdleConns(f.poolSize())

	// The other arms' reports bypass pgtraffic: plain pgx pools, as a team without it has.
	plain := func(open int, params map[string]string) (*sql.DB, error) {
		pc, err := pgx.ParseConfig(dsn)
		if err != nil {
			return nil, fmt.Errorf("noisy-neighbor: %w", err)
		}
		for k, v := range params {
			pc.RuntimeParams[k] = v
		}
		pc.Tracer = execTracer{}
		pdb := stdlib.OpenDB(*pc)
		pdb.SetMaxOpenConns(open)
		pdb.SetMaxIdleConns(open)
		return pdb, nil
	}
	uncontrolled, err := plain(f.noise, nil)
	if err != nil {
		return nil, err
	}
	defer uncontrolled.Close()
	oneConn, err := plain(1, nil)
	if err != nil {
		return nil, err
	}
	defer oneConn.Close()
	timeout, err := plain(f.noise, map[string]string{"statement_timeout": fmt.Sprint(f.perQuery.Milliseconds())})
	if err != nil {
		return nil, err
	}
	defer timeout.Close()
	// admin watches the server between arms; it runs no workload.
	admin, err := plain(1, nil)
	if err != nil {
		return nil, err
	}
	defer admin.Close()

	fmt.Fprintf(w, "loading %d orders and %d accounts ...\n", f.orders, f.accounts)
	if err := setup(ctx, db, f.orders, f.accounts); err != nil {
		return nil, err
	}

	arms := []armSpec{
		{name: armSolo},
		{name: armUncontrolled, reports: uncontrolled},
		{name: armOneConn, reports: oneConn},
		{name: armTimeout, reports: timeout},
		{name: armPgtraffic, reports: db, check: c.Check},
	}
	fmt.Fprintf(w, "running %d round(s) of %d arms of %v: %d checkout workers on a pool of %d connections, %d reporting workers\n",
		f.rounds, len(arms), f.phase, f.workers, f.poolSize(), f.noise)
	res, err := newExperiment(db, admin, f, w).run(ctx, schedule(arms, f.rounds))
	if err != nil {
		return nil, err
	}

	fmt.Fprintln(w)
	if la := loadAverage(); la != "" {
		fmt.Fprintf(w, "load average at the start (1, 5, 15 min): %s; at the end: %s\n", laStart, la)
	}
	printTable(w, res, f.share, f.poolSize())
	fmt.Fprintln(w)
	printTargets(w, res, f.share, f.burst, f.phase)
	for _, b := range c.Snapshot().Budgets {
		fmt.Fprintf(w, "\nbudget %s (%s, max_concurrent %d, per_query_limit %v, server_share %g, burst_limit %v, max_wait %v): admitted %d reports, refused %d\n",
			b.Name, b.Mode, f.maxConcurrent, f.perQuery, f.share, f.burst, f.maxWait, b.Admitted, b.Blocked)
	}
	if p := res.arm(armPgtraffic); p != nil {
		fmt.Fprintf(w, "pgtraffic arm: the report workers' Check was denied %d times, each time before they took a connection\n", p.noiseChecked)
	}

	if err := writeChart(f.out, res, f.window); err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "\nchart written to %s\n", f.out)
	return res, nil
}

// schedule returns rounds rounds of every arm, the order rotated by one arm each round so that
// no arm always runs first, or always after the same arm.
func schedule(arms []armSpec, rounds int) []armSpec {
	var out []armSpec
	for r := range rounds {
		for i := range arms {
			a := arms[(i+r)%len(arms)]
			a.round = r + 1
			out = append(out, a)
		}
	}
	return out
}

// loadAverage returns the machine's load averages over 1, 5 and 15 minutes, or "" where
// /proc/loadavg does not tell them (Linux only).
func loadAverage() string {
	la, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	if avg := strings.Fields(string(la)); len(avg) >= 3 {
		return strings.Join(avg[:3], " ")
	}
	return ""
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
