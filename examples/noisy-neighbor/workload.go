package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// setup creates the tables: accounts for the checkout path (point reads and writes by primary
// key), and orders, customers for the reports (whole-table scans, aggregates, hash joins).
func setup(ctx context.Context, db *sql.DB, orders, accounts int) error {
	customers := max(orders/100, 10)
	for _, q := range []string{
		`drop table if exists accounts, orders, customers`,
		`create table accounts (id int primary key, balance bigint not null, updated timestamptz not null)`,
		fmt.Sprintf(`insert into accounts select g, 1000, now() from generate_series(1, %d) g`, accounts),
		`create table customers (id int primary key, region text not null)`,
		fmt.Sprintf(`insert into customers select g, 'region-' || (g %% 17) from generate_series(1, %d) g`, customers),
		`create table orders (id int primary key, customer int not null, amount numeric not null, note text not null)`,
		fmt.Sprintf(`insert into orders
		 select g, 1 + (g::bigint * 7919) %% %d, (g %% 9973) / 100.0, md5(g::text)
		   from generate_series(1, %d) g`, customers, orders),
		`vacuum analyze accounts, customers, orders`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("noisy-neighbor: setup: %w", err)
		}
	}
	// Read each report once so that every arm starts with the tables in memory.
	for _, q := range reports {
		rows, err := db.QueryContext(ctx, q)
		if err != nil {
			return fmt.Errorf("noisy-neighbor: warm-up: %w", err)
		}
		for rows.Next() {
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return fmt.Errorf("noisy-neighbor: warm-up: %w", err)
		}
	}
	return nil
}

// reports are the noisy workload's queries: each burns a core for a few hundred milliseconds on
// the orders table (an aggregate with a sort, a LIKE scan, a hash join with an aggregate).
var reports = []string{
	`select customer, sum(amount), count(*) from orders group by customer order by 2 desc limit 20`,
	`select count(*), sum(amount) from orders where note like '%ab%c%'`,
	`select c.region, count(*), avg(o.amount) from orders o join customers c on c.id = o.customer group by c.region order by 3 desc`,
}

// The arms, in the order of the first round (see [schedule]).
const (
	armSolo         = "solo"
	armUncontrolled = "uncontrolled"
	armOneConn      = "one-conn"
	armTimeout      = "timeout"
	armPgtraffic    = "pgtraffic"
)

// armNames are the arms in the order the table and the chart list them.
var armNames = []string{armSolo, armUncontrolled, armOneConn, armTimeout, armPgtraffic}

// armSpec is one run of an arm: the *sql.DB the reports run on (nil: no reports), and, in the
// pgtraffic arm, the connector's Check, which a report worker asks before it takes a
// connection (nil: it takes one at once).
type armSpec struct {
	name    string
	round   int
	reports *sql.DB
	check   func(context.Context) error
}

// sample is one completed checkout statement: when it started (since the experiment began)
// and how long it took.
type sample struct {
	at, latency time.Duration
}

// armResult is what one arm measured: one run of an arm, or (from [results.arm]) all the runs
// of one arm merged.
type armResult struct {
	name          string
	start, end    time.Duration // since the experiment began; for merged runs, of the first and last
	measured      time.Duration // time measured: end - start, or the runs' sum
	critical      []sample
	checkouts     int64         // checkout statements measured (critical may not hold them all yet)
	noiseDone     int64         // reports completed
	noiseRefused  int64         // reports refused by the budget (each retry counts)
	noiseChecked  int64         // checks denied before a report took a connection (pgtraffic)
	noiseTimedOut int64         // reports cancelled by statement_timeout
	noiseBusy     time.Duration // execution time of the reports, summed (cut-off ones included)
	noiseHeld     int           // connections the report workers hold now
	noisePeak     int           // the most connections the report workers held at once
	noiseStarts   []time.Duration
	noiseFinishes []time.Duration
}

// results are the runs of the arms in the order they ran.
type results struct {
	runs []*armResult
}

// arm returns the runs of the named arm merged, or nil if it never ran.
func (r *results) arm(name string) *armResult {
	var m *armResult
	for _, p := range r.runs {
		if p.name != name {
			continue
		}
		if m == nil {
			m = &armResult{name: name, start: p.start}
		}
		m.end = p.end
		m.measured += p.measured
		m.critical = append(m.critical, p.critical...)
		m.noiseDone += p.noiseDone
		m.noiseRefused += p.noiseRefused
		m.noiseChecked += p.noiseChecked
		m.noiseTimedOut += p.noiseTimedOut
		m.noiseBusy += p.noiseBusy
		m.noisePeak = max(m.noisePeak, p.noisePeak)
		m.checkouts += p.checkouts
		m.noiseStarts = append(m.noiseStarts, p.noiseStarts...)
		m.noiseFinishes = append(m.noiseFinishes, p.noiseFinishes...)
	}
	return m
}

// experiment runs the workloads. The checkout workers run through all arms; the reporting
// workers run only in the arms that have reports.
type experiment struct {
	db    *sql.DB // the checkout's, through pgtraffic
	admin *sql.DB // watches the server between arms
	f     flags
	out   io.Writer // progress
	t0    time.Time

	mu      sync.Mutex // protects the fields below
	current *armResult
}

func newExperiment(db, admin *sql.DB, f flags, out io.Writer) *experiment {
	return &experiment{db: db, admin: admin, f: f, out: out}
}

func (ex *experiment) run(ctx context.Context, specs []armSpec) (*results, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ex.t0 = time.Now()

	var critical sync.WaitGroup
	var errMu sync.Mutex // protects firstErr
	var firstErr error
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
		cancel()
	}
	for w := range ex.f.workers {
		critical.Go(func() {
			if err := ex.checkout(ctx, uint64(w)); err != nil {
				fail(err)
			}
		})
	}

	res := &results{}
	for _, spec := range specs {
		// Unmeasured: the checkout workers warm up (first arm), or the last arm's reports
		// finish on the server (a report cancelled by its context runs on until it next
		// writes to the client) and the server calms down.
		if err := ex.quiesce(ctx); err != nil {
			fail(err)
			break
		}
		sleepCtx(ctx, ex.f.settle)
		p := &armResult{name: spec.name, start: time.Since(ex.t0)}
		ex.mu.Lock()
		ex.current = p
		ex.mu.Unlock()

		armCtx, stop := context.WithTimeout(ctx, ex.f.phase)
		var noise sync.WaitGroup
		if spec.reports != nil {
			for w := range ex.f.noise {
				noise.Go(func() {
					if err := ex.report(armCtx, p, spec.reports, spec.check, w); err != nil {
						fail(err)
					}
				})
			}
		}
		if ex.f.untilShown {
			for !ex.shown(p) && sleepCtx(armCtx, 10*time.Millisecond) {
			}
			stop()
		}
		<-armCtx.Done()
		stop()
		ex.mu.Lock()
		p.end = time.Since(ex.t0)
		p.measured = p.end - p.start
		ex.current = nil
		ex.mu.Unlock()
		noise.Wait()
		res.runs = append(res.runs, p)
		if ctx.Err() != nil {
			break
		}
		// Checkout workers add this run's last samples at their next statement, which may
		// wait for a connection: give them up to 2 s (the line's p99 needs them, the table's
		// gets them all in the end).
		for wait := 0; wait < 100 && !ex.flushed(p); wait++ {
			sleepCtx(ctx, 20*time.Millisecond)
		}
		ex.mu.Lock()
		n, st := p.checkouts, p.stats()
		ex.mu.Unlock()
		fmt.Fprintf(ex.out, "  round %d %-12s %6d checkout statements (p99 %7s), %3d reports completed, %4d refused, %3d timed out, at most %2d connections held by reports\n",
			spec.round, p.name, n, ms(st.p99), p.noiseDone, p.noiseRefused, p.noiseTimedOut, p.noisePeak)
	}
	cancel()
	critical.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return res, nil
}

// flushed reports whether the checkout workers have added all the run p's samples.
func (ex *experiment) flushed(p *armResult) bool {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	return int64(len(p.critical)) == p.checkouts
}

// shown reports whether the run p has shown what its arm stands for: 100 checkout statements
// measured and, beside them, a report completed (uncontrolled: while another report also held
// a connection), refused by the budget (pgtraffic) or cancelled by statement_timeout (timeout).
func (ex *experiment) shown(p *armResult) bool {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if p.checkouts < 100 {
		return false
	}
	switch p.name {
	case armUncontrolled:
		return p.noiseDone > 0 && p.noisePeak > 1
	case armOneConn:
		return p.noiseDone > 0
	case armTimeout:
		return p.noiseTimedOut > 0
	case armPgtraffic:
		return p.noiseRefused > 0
	}
	return true
}

// quiesce waits, for up to 30 s, until the server runs no report.
func (ex *experiment) quiesce(ctx context.Context) error {
	const q = `select count(*) from pg_stat_activity
	            where state = 'active' and pid <> pg_backend_pid() and query like '%from orders%'`
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		var n int
		if err := ex.admin.QueryRowContext(ctx, q).Scan(&n); err != nil {
			if ctx.Err() != nil {
				return nil // the deadline, or the experiment ending: go on regardless
			}
			return fmt.Errorf("noisy-neighbor: watching pg_stat_activity: %w", err)
		}
		if n == 0 {
			return nil
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
}

// checkout is one closed-loop checkout worker: 80% point selects, 20% single-row updates, on
// random accounts, until ctx ends. Each statement's latency is recorded in the current arm.
func (ex *experiment) checkout(ctx context.Context, seed uint64) error {
	ctx = tagging.With(ctx, "app", "checkout")
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	n := ex.f.accounts
	var local []sample
	var owner *armResult
	flush := func() {
		if owner != nil && len(local) > 0 {
			ex.mu.Lock()
			owner.critical = append(owner.critical, local...)
			ex.mu.Unlock()
		}
		local = local[:0]
	}
	defer flush()
	for ctx.Err() == nil {
		id := 1 + rng.IntN(n)
		start := time.Now()
		var err error
		if rng.IntN(5) == 0 {
			_, err = ex.db.ExecContext(ctx, `update accounts set balance = balance + $1, updated = now() where id = $2`, rng.IntN(100)-50, id)
		} else {
			var balance int64
			err = ex.db.QueryRowContext(ctx, `select balance from accounts where id = $1`, id).Scan(&balance)
		}
		lat := time.Since(start)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("noisy-neighbor: checkout: %w", err)
		}
		at := start.Sub(ex.t0)
		ex.mu.Lock()
		cur := ex.current
		// Count a statement only if it started and ended inside the arm.
		if cur != nil && at < cur.start {
			cur = nil
		}
		if cur != nil {
			cur.checkouts++
		}
		ex.mu.Unlock()
		if cur != owner {
			flush()
			owner = cur
		}
		if owner != nil {
			local = append(local, sample{at: at, latency: lat})
			if len(local) >= 256 {
				flush()
			}
		}
		if ex.f.think > 0 {
			sleepCtx(ctx, ex.f.think)
		}
	}
	return nil
}

// report is one reporting worker: it runs the reports in turn on db until ctx ends. A report
// refused by the budget is retried with a growing back-off, never before the RetryAfter the
// budget gave, as a well behaved batch job does; one refused as never fitting (per_query_limit)
// is skipped after the same back-off. One cancelled by statement_timeout is given up at once.
//
// With check (the pgtraffic arm), the worker asks the budget before it takes a connection, as
// a batch job on database/sql does: under database/sql the engine decides a statement on the
// connection database/sql hands it, so a report refused at once (its budget's queue full)
// still holds one of the application's connections for its decision. A denied check is backed
// off as a refusal is, holding no connection; a check that passes takes nothing, so the report
// may still wait for its turn (max_wait) or be refused.
//
// The worker holds a connection from when it has one (its statement call starts then) until it
// hands it back; the arm counts how many the workers hold at once. A report's execution clock
// starts when pgx sends it ([execTracer]): not while the worker waits for a connection (the
// one-conn arm, the shared pool) nor while the budget makes it wait for its turn (max_wait).
func (ex *experiment) report(ctx context.Context, p *armResult, db *sql.DB, check func(context.Context) error, w int) error {
	ctx = tagging.With(ctx, "app", "reporting")
	rng := rand.New(rand.NewPCG(uint64(w), 0xb16))
	blocks := 0 // consecutive refusals
	for i := w; ctx.Err() == nil; i++ {
		q := reports[i%len(reports)]
		for ctx.Err() == nil {
			if check != nil {
				var be *driver.BlockedError
				if err := check(ctx); errors.As(err, &be) {
					ex.mu.Lock()
					p.noiseChecked++
					ex.mu.Unlock()
					sleepCtx(ctx, backoff(be, &blocks, rng))
					continue
				} else if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return fmt.Errorf("noisy-neighbor: report: %w", err)
				}
			}
			conn, err := db.Conn(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("noisy-neighbor: report: %w", err)
			}
			ex.mu.Lock()
			p.noiseHeld++
			p.noisePeak = max(p.noisePeak, p.noiseHeld)
			ex.mu.Unlock()
			clock := &execClock{sql: q}
			err = drain(context.WithValue(ctx, execClockKey{}, clock), conn, q)
			end := time.Now()
			err = errors.Join(err, conn.Close())
			ex.mu.Lock()
			p.noiseHeld--
			ex.mu.Unlock()
			var be *driver.BlockedError
			if errors.As(err, &be) {
				ex.mu.Lock()
				p.noiseRefused++
				ex.mu.Unlock()
				sleepCtx(ctx, backoff(be, &blocks, rng))
				if be.Reason == driver.ReasonPerQuery {
					break // predicted larger than the budget allows: it never fits, so move on
				}
				continue
			}
			blocks = 0
			timedOut := isQueryCanceled(err) && ctx.Err() == nil
			if err != nil && !timedOut && ctx.Err() == nil {
				return fmt.Errorf("noisy-neighbor: report: %w", err)
			}
			if clock.start.IsZero() {
				break // ctx ended before the report was sent (while it waited for its turn)
			}
			// A report cut off at the end of the arm, or by statement_timeout, still loaded
			// the server until then.
			ex.mu.Lock()
			switch {
			case err == nil:
				p.noiseDone++
			case timedOut:
				p.noiseTimedOut++
			}
			p.noiseBusy += end.Sub(clock.start)
			p.noiseStarts = append(p.noiseStarts, clock.start.Sub(ex.t0))
			p.noiseFinishes = append(p.noiseFinishes, end.Sub(ex.t0))
			ex.mu.Unlock()
			break
		}
	}
	return nil
}

// backoff is how long a report worker waits after its blocks-th refusal (or denied check) in a
// row, be: exponentially from 50 ms (to 800 ms), never less than be's RetryAfter, and a jitter
// of up to half that, which keeps the workers from retrying in step. It counts the refusal.
func backoff(be *driver.BlockedError, blocks *int, rng *rand.Rand) time.Duration {
	wait := max(be.RetryAfter, min(50*time.Millisecond<<*blocks, 800*time.Millisecond))
	*blocks++
	return wait + time.Duration(rng.Int64N(int64(wait/2)+1))
}

// execClock is a report's execution clock: start is when pgx sent the statement sql, zero
// until then. It travels in the statement's context, under execClockKey.
type execClock struct {
	sql   string
	start time.Time
}

type execClockKey struct{}

// execTracer is a pgx tracer that starts the execution clock in a statement's context when
// pgx sends that statement; the EXPLAIN pgtraffic may run first to predict its cost is another
// text and leaves the clock alone. pgx calls it on the goroutine of the statement's caller.
type execTracer struct{}

func (execTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if c, ok := ctx.Value(execClockKey{}).(*execClock); ok && c.start.IsZero() && data.SQL == c.sql {
		c.start = time.Now()
	}
	return ctx
}

func (execTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// isQueryCanceled reports whether the server cancelled the statement (query_canceled), as
// statement_timeout does.
func isQueryCanceled(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == pgerrcode.QueryCanceled
}

// drain runs q on conn and reads all its rows.
func drain(ctx context.Context, conn *sql.Conn, q string) error {
	rows, err := conn.QueryContext(ctx, q)
	if err != nil {
		return err
	}
	for rows.Next() {
	}
	return errors.Join(rows.Err(), rows.Close())
}

// sleepCtx sleeps for d or until ctx ends; it reports whether it slept for d.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
