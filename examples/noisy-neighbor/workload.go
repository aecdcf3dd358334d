package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

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
	// Read each report once so that every phase starts with the tables in memory.
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
// a million orders (an aggregate with a sort, a LIKE scan, a hash join with an aggregate).
var reports = []string{
	`select customer, sum(amount), count(*) from orders group by customer order by 2 desc limit 20`,
	`select count(*), sum(amount) from orders where note like '%ab%c%'`,
	`select c.region, count(*), avg(o.amount) from orders o join customers c on c.id = o.customer group by c.region order by 3 desc`,
}

// phaseSpec is one run of a phase: whether the reporting workload runs, and the rules put in
// force for it.
type phaseSpec struct {
	name   string
	round  int
	noise  bool
	config *driver.Config
}

// sample is one completed checkout statement: when it started (since the experiment began)
// and how long it took.
type sample struct {
	at, latency time.Duration
}

// phaseResult is what one phase measured: one run of a phase, or (from [results.phase]) all the
// runs of one phase merged.
type phaseResult struct {
	name          string
	start, end    time.Duration // since the experiment began; for merged runs, of the first and last
	measured      time.Duration // time measured: end - start, or the runs' sum
	critical      []sample
	noiseDone     int64
	noiseBlocked  int64
	noiseBusy     time.Duration // execution time of the reports, summed (cut-off ones included)
	noiseStarts   []time.Duration
	noiseFinishes []time.Duration
}

// results are the runs of the phases in the order they ran: solo, uncontrolled, controlled,
// repeated for each round.
type results struct {
	runs []*phaseResult
}

// phaseNames are the phases in the order they run in each round.
var phaseNames = []string{"solo", "uncontrolled", "controlled"}

// phase returns the runs of the named phase merged, or nil if it never ran.
func (r *results) phase(name string) *phaseResult {
	var m *phaseResult
	for _, p := range r.runs {
		if p.name != name {
			continue
		}
		if m == nil {
			m = &phaseResult{name: name, start: p.start}
		}
		m.end = p.end
		m.measured += p.measured
		m.critical = append(m.critical, p.critical...)
		m.noiseDone += p.noiseDone
		m.noiseBlocked += p.noiseBlocked
		m.noiseBusy += p.noiseBusy
		m.noiseStarts = append(m.noiseStarts, p.noiseStarts...)
		m.noiseFinishes = append(m.noiseFinishes, p.noiseFinishes...)
	}
	return m
}

// experiment runs the workloads. The checkout workers run through all phases; the reporting
// workers run only in the phases that ask for them.
type experiment struct {
	db *sql.DB
	f  flags
	t0 time.Time

	mu      sync.Mutex // protects the fields below
	current *phaseResult
}

func newExperiment(db *sql.DB, f flags) *experiment { return &experiment{db: db, f: f} }

func (ex *experiment) run(ctx context.Context, c *driver.Connector, specs []phaseSpec) (*results, error) {
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
	for i, spec := range specs {
		if i > 0 || ex.f.settle > 0 {
			// Unmeasured: the checkout workers warm up (first phase) or the last phase's reports
			// finish being cancelled.
			sleepCtx(ctx, ex.f.settle)
		}
		if err := c.SetConfig(spec.config); err != nil {
			fail(err)
			break
		}
		p := &phaseResult{name: spec.name, start: time.Since(ex.t0)}
		ex.mu.Lock()
		ex.current = p
		ex.mu.Unlock()

		phaseCtx, stop := context.WithTimeout(ctx, ex.f.phase)
		var noise sync.WaitGroup
		if spec.noise {
			for w := range ex.f.noise {
				noise.Go(func() {
					if err := ex.report(phaseCtx, p, w); err != nil {
						fail(err)
					}
				})
			}
		}
		<-phaseCtx.Done()
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
		fmt.Printf("  round %d %-12s %6d checkout statements, %3d reports completed, %4d blocked\n",
			spec.round, p.name, len(p.critical), p.noiseDone, p.noiseBlocked)
	}
	cancel()
	critical.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return res, nil
}

// checkout is one closed-loop checkout worker: 80% point selects, 20% single-row updates, on
// random accounts, until ctx ends. Each statement's latency is recorded in the current phase.
func (ex *experiment) checkout(ctx context.Context, seed uint64) error {
	ctx = tagging.With(ctx, "app", "checkout")
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	n := ex.f.accounts
	var local []sample
	var owner *phaseResult
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
		// Count a statement only if it started and ended inside the phase.
		if cur != nil && at < cur.start {
			cur = nil
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

// report is one reporting worker: it runs the reports in turn until ctx ends. A blocked report
// is retried with a growing back-off, never before the RetryAfter the budget gave, as a well
// behaved batch job does; one refused as never fitting (per_query_limit) is skipped.
func (ex *experiment) report(ctx context.Context, p *phaseResult, w int) error {
	ctx = tagging.With(ctx, "app", "reporting")
	rng := rand.New(rand.NewPCG(uint64(w), 0xb16))
	blocks := 0 // consecutive blocks
	for i := w; ctx.Err() == nil; i++ {
		q := reports[i%len(reports)]
		for ctx.Err() == nil {
			start := time.Now()
			err := drain(ctx, ex.db, q)
			var be *driver.BlockedError
			if errors.As(err, &be) {
				atomic.AddInt64(&p.noiseBlocked, 1)
				if be.Reason == driver.ReasonPerQuery {
					break // predicted larger than the budget allows: it never fits, so move on
				}
				// Back off exponentially from 50 ms (to 800 ms) while blocked, and never retry
				// before RetryAfter; the jitter keeps the workers from retrying in step.
				wait := max(be.RetryAfter, min(50*time.Millisecond<<blocks, 800*time.Millisecond))
				blocks++
				sleepCtx(ctx, wait+time.Duration(rng.Int64N(int64(wait/2)+1)))
				continue
			}
			blocks = 0
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("noisy-neighbor: report: %w", err)
			}
			// A report cut off at the end of the phase still loaded the server until then.
			end := time.Now()
			ex.mu.Lock()
			if err == nil {
				p.noiseDone++
			}
			p.noiseBusy += end.Sub(start)
			p.noiseStarts = append(p.noiseStarts, start.Sub(ex.t0))
			p.noiseFinishes = append(p.noiseFinishes, end.Sub(ex.t0))
			ex.mu.Unlock()
			break
		}
	}
	return nil
}

// drain runs q and reads all its rows.
func drain(ctx context.Context, db *sql.DB, q string) error {
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return err
	}
	for rows.Next() {
	}
	return errors.Join(rows.Err(), rows.Close())
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
