package main

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/XSAM/otelsql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The overhead benchmark compares, on the same statements and the same database:
//
//	pgx        database/sql with pgx's stdlib driver: the baseline
//	pgtraffic  pgtraffic with no rules
//	budget     pgtraffic with an enforce budget selected by a context tag (tags, cost from a
//	           cached EXPLAIN, concurrency slot, bucket)
//	trace      pgtraffic with no rules and a recording tracer provider
//	otelsql    XSAM/otelsql around pgx's stdlib connector with the same tracer provider
//
// on two workloads: a single-row select, and pgbench's TPC-B-like transaction (update an
// account, read it back, update a teller and a branch, insert into history). Each mode has one
// connection, so the figures are per-statement client overhead plus one round trip.
//
// Wall-time ratios need the modes interleaved so that drift of a shared machine cancels:
// TestOverheadRounds runs rounds of modes × statements round-robin and prints the table
// (PGTRAFFIC_OVERHEAD=1 go test -v -run TestOverheadRounds . in integration/instr; make wall, and the end
// of make bench, run it with the server and the client pinned to different CPUs). Instruction counts,
// the stable figure, come from integration/scripts/instr.sh (make instr). BenchmarkOverhead has the same
// cases as ordinary sub-benchmarks, which run one after another.

// overheadModes are the modes in the order the table prints them; pgx must stay first.
var overheadModes = []string{"pgx", "pgtraffic", "budget", "trace", "otelsql"}

// overheadRules is the budget of the budget mode, selected by the context tag app=overhead.
// Its limits are far above what one connection uses, so nothing is blocked, but server_share
// makes every statement costed and max_concurrent takes a slot: the whole admission path.
const overheadRules = `
budgets:
  - name: overhead
    mode: enforce
    max_concurrent: 64
    server_share: 0.5
    burst_limit: 30s
rules:
  - budget: overhead
    match: {app: overhead}
`

// overheadDB is one mode's database handle.
type overheadDB struct {
	mode string
	db   *sql.DB
	conn *driver.Connector // nil for pgx and otelsql
}

// openOverheadModes opens every mode on dsn, one connection each.
func openOverheadModes(tb testing.TB, dsn string) []overheadDB {
	tb.Helper()
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithSpanProcessor(dropSpans{}),
	)
	tb.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg, err := driver.ParseConfig([]byte(overheadRules))
	if err != nil {
		tb.Fatal(err)
	}
	connector := func(opts ...driver.Option) *driver.Connector {
		c, err := driver.NewConnector(dsn, opts...)
		if err != nil {
			tb.Fatal(err)
		}
		return c
	}
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		tb.Fatal(err)
	}
	plain := connector()
	budgeted := connector(driver.WithConfig(cfg))
	traced := connector(driver.WithTracerProvider(tp))
	dbs := []overheadDB{
		{mode: "pgx", db: raw},
		{mode: "pgtraffic", db: sql.OpenDB(plain), conn: plain},
		{mode: "budget", db: sql.OpenDB(budgeted), conn: budgeted},
		{mode: "trace", db: sql.OpenDB(traced), conn: traced},
		{mode: "otelsql", db: otelsql.OpenDB(stdlib.GetConnector(*cc), otelsql.WithTracerProvider(tp))},
	}
	for i, d := range dbs {
		if d.mode != overheadModes[i] {
			tb.Fatalf("mode %d is %q, want %q", i, d.mode, overheadModes[i])
		}
		d.db.SetMaxOpenConns(1)
		d.db.SetMaxIdleConns(1)
		tb.Cleanup(func() { d.db.Close() })
	}
	return dbs
}

// dropSpans is a span processor that discards every span: export is not what is measured.
type dropSpans struct{}

func (dropSpans) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (dropSpans) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (dropSpans) Shutdown(context.Context) error                  { return nil }
func (dropSpans) ForceFlush(context.Context) error                { return nil }

// pgbench's scale is shrunk: the client-side cost does not depend on the table sizes.
const (
	benchBranches = 1
	benchTellers  = 10
	benchAccounts = 10_000
	// tpcbStatements is the statements of one TPC-B transaction, not counting BEGIN and COMMIT
	// (whose round trips are included in its time).
	tpcbStatements = 5
)

// setupPgbench creates pgbench's four tables, as pgbench -i does.
func setupPgbench(tb testing.TB, db *sql.DB) {
	tb.Helper()
	for _, s := range []string{
		`create table pgbench_branches (bid int primary key, bbalance int not null, filler char(88))`,
		`create table pgbench_tellers (tid int primary key, bid int not null, tbalance int not null, filler char(84))`,
		`create table pgbench_accounts (aid int primary key, bid int not null, abalance int not null, filler char(84))`,
		`create table pgbench_history (tid int, bid int, aid int, delta int, mtime timestamp, filler char(22))`,
		fmt.Sprintf(`insert into pgbench_branches select b, 0 from generate_series(1, %d) b`, benchBranches),
		fmt.Sprintf(`insert into pgbench_tellers select t, (t - 1) %% %d + 1, 0 from generate_series(1, %d) t`, benchBranches, benchTellers),
		fmt.Sprintf(`insert into pgbench_accounts select a, (a - 1) %% %d + 1, 0 from generate_series(1, %d) a`, benchBranches, benchAccounts),
		`vacuum analyze`,
	} {
		if _, err := db.Exec(s); err != nil {
			tb.Fatalf("pgbench set-up: %v", err)
		}
	}
}

// workload is one operation of a benchmark: a statement or a transaction of statements.
type workload struct {
	name       string
	statements int // statements per operation
	run        func(ctx context.Context, db *sql.DB, rng *rand.Rand, i int) error
}

var overheadWorkloads = []workload{
	{name: "select", statements: 1, run: selectOne},
	{name: "tpcb", statements: tpcbStatements, run: tpcb},
}

// selectOne is a single-row select: the smallest statement, where the driver's share is largest.
func selectOne(ctx context.Context, db *sql.DB, _ *rand.Rand, i int) error {
	var got int
	if err := db.QueryRowContext(ctx, "select $1::int + 1", i).Scan(&got); err != nil {
		return err
	}
	if got != i+1 {
		return fmt.Errorf("select %d + 1: got %d", i, got)
	}
	return nil
}

// tpcb is pgbench's built-in TPC-B-like script.
func tpcb(ctx context.Context, db *sql.DB, rng *rand.Rand, _ int) (err error) {
	aid := rng.IntN(benchAccounts) + 1
	tid := rng.IntN(benchTellers) + 1
	bid := rng.IntN(benchBranches) + 1
	delta := rng.IntN(10_001) - 5_000
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if _, err = tx.ExecContext(ctx, "update pgbench_accounts set abalance = abalance + $1 where aid = $2", delta, aid); err != nil {
		return err
	}
	var balance int
	if err = tx.QueryRowContext(ctx, "select abalance from pgbench_accounts where aid = $1", aid).Scan(&balance); err != nil {
		return err
	}
	if _, err = tx.ExecContext(ctx, "update pgbench_tellers set tbalance = tbalance + $1 where tid = $2", delta, tid); err != nil {
		return err
	}
	if _, err = tx.ExecContext(ctx, "update pgbench_branches set bbalance = bbalance + $1 where bid = $2", delta, bid); err != nil {
		return err
	}
	if _, err = tx.ExecContext(ctx, "insert into pgbench_history (tid, bid, aid, delta, mtime) values ($1, $2, $3, $4, current_timestamp)",
		tid, bid, aid, delta); err != nil {
		return err
	}
	return tx.Commit()
}

// overheadContext carries the tag that selects the budget mode's budget. Every mode gets it, so
// only the driver differs between them.
func overheadContext() context.Context {
	return tagging.With(context.Background(), "app", "overhead")
}

// checkOverheadCounters asserts that the pgtraffic modes blocked nothing and that the budget
// mode costed its statements from cached EXPLAINs.
func checkOverheadCounters(tb testing.TB, dbs []overheadDB, patterns int) {
	tb.Helper()
	for _, d := range dbs {
		if d.conn == nil {
			continue
		}
		c := d.conn.Snapshot().Counters
		if c.Blocked != 0 || c.Warned != 0 {
			tb.Errorf("%s: blocked %d, warned %d; want none", d.mode, c.Blocked, c.Warned)
		}
		if d.mode != "budget" {
			if c.ExplainCalls != 0 {
				tb.Errorf("%s: %d EXPLAIN calls with no budget", d.mode, c.ExplainCalls)
			}
			continue
		}
		// One EXPLAIN per pattern, plus one per plan-cache TTL on a long run.
		if c.ExplainCalls < uint64(patterns) || c.ExplainCacheHits == 0 || c.ExplainFailures != 0 {
			tb.Errorf("budget: EXPLAIN calls %d (want ≥ %d), cache hits %d, failures %d",
				c.ExplainCalls, patterns, c.ExplainCacheHits, c.ExplainFailures)
		}
		if c.ExplainCalls > c.ExplainCacheHits/10+uint64(4*patterns) {
			tb.Errorf("budget: %d EXPLAIN calls for %d cache hits; plan costs are not cached", c.ExplainCalls, c.ExplainCacheHits)
		}
	}
}

func envInt(tb testing.TB, name string, def int) int {
	tb.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		tb.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}

// modeTotals accumulates one mode's measurements over the rounds.
type modeTotals struct {
	wall    time.Duration
	cpu     time.Duration // the process's user + system CPU time (client work, every goroutine)
	ops     int
	mallocs uint64
	perOp   []float64 // ns per operation in each round
}

// TestOverheadRounds measures wall time per statement for every mode, interleaved: each round
// runs K statements of every mode, in a random order drawn afresh every round, so that drift of the machine
// (other processes, CPU frequency, the server's caches and table growth) lands on all modes
// alike. It prints, per mode, the mean and the median over rounds of ns/statement, the ratio to
// pgx of the totals and the median of the per-round ratios (the figure to quote on a shared
// machine: a burst of load spoils a few rounds, not the median), and allocations per statement.
//
// Without PGTRAFFIC_OVERHEAD=1 it runs one short round, which checks that every mode and
// workload works and answers correctly, and prints nothing. With it, PGTRAFFIC_OVERHEAD_ROUNDS
// (default 100) and PGTRAFFIC_OVERHEAD_K (statements per mode per round, default 100) size the run.
func TestOverheadRounds(t *testing.T) {
	full := os.Getenv("PGTRAFFIC_OVERHEAD") == "1"
	rounds, k := 1, 25
	if full {
		rounds = envInt(t, "PGTRAFFIC_OVERHEAD_ROUNDS", 100)
		k = envInt(t, "PGTRAFFIC_OVERHEAD_K", 100)
	}
	dsn := pgtest.Shared(t).CreateDatabase(t)
	dbs := openOverheadModes(t, dsn)
	setupPgbench(t, dbs[0].db)
	ctx := overheadContext()

	var report strings.Builder
	fmt.Fprintf(&report, "overhead: %d rounds × %d statements per mode, GOMAXPROCS=%d\n", rounds, k, runtime.GOMAXPROCS(0))
	for _, w := range overheadWorkloads {
		ops := max(1, k/w.statements)
		totals := make([]modeTotals, len(dbs))
		rngs := make([]*rand.Rand, len(dbs))
		for m := range dbs {
			rngs[m] = rand.New(rand.NewPCG(uint64(m), 1))
			// Warm-up, untimed: connection, pgx statement cache, pattern cache, first EXPLAINs.
			for i := range max(ops, 50) {
				if err := w.run(ctx, dbs[m].db, rngs[m], i); err != nil {
					t.Fatalf("%s/%s warm-up: %v", w.name, dbs[m].mode, err)
				}
			}
		}
		var ms runtime.MemStats
		order := rand.New(rand.NewPCG(uint64(len(w.name)), 2))
		for r := range rounds {
			// A new order every round: with a fixed or rotated one, each mode would always
			// follow the same mode, whose garbage, cache and heap footprint it would inherit
			// (the tracing modes leave the most), a bias no number of rounds removes.
			for _, m := range order.Perm(len(dbs)) {
				runtime.ReadMemStats(&ms)
				mallocs := ms.Mallocs
				cpu0 := processCPU(t)
				start := time.Now()
				for i := range ops {
					if err := w.run(ctx, dbs[m].db, rngs[m], r*ops+i); err != nil {
						t.Fatalf("%s/%s round %d: %v", w.name, dbs[m].mode, r, err)
					}
				}
				elapsed := time.Since(start)
				cpu := processCPU(t) - cpu0
				runtime.ReadMemStats(&ms)
				tm := &totals[m]
				tm.wall += elapsed
				tm.cpu += cpu
				tm.ops += ops
				tm.mallocs += ms.Mallocs - mallocs
				tm.perOp = append(tm.perOp, float64(elapsed.Nanoseconds())/float64(ops))
			}
		}
		base := &totals[0]
		fmt.Fprintf(&report, "\n%s (%d statement(s) per operation)\n", w.name, w.statements)
		fmt.Fprintf(&report, "%-10s %12s %12s %12s %12s %12s %12s\n",
			"mode", "mean ns/st", "median ns/st", "mean ratio", "median ratio", "cpu ns/st", "allocs/st")
		for m, tm := range totals {
			if tm.ops != rounds*ops {
				t.Fatalf("%s/%s: %d operations, want %d", w.name, dbs[m].mode, tm.ops, rounds*ops)
			}
			stmts := float64(tm.ops * w.statements)
			perRound := make([]float64, rounds)
			for r := range rounds {
				perRound[r] = tm.perOp[r] / base.perOp[r]
			}
			fmt.Fprintf(&report, "%-10s %12.0f %12.0f %12.3f %12.3f %12.0f %12.1f\n", dbs[m].mode,
				float64(tm.wall.Nanoseconds())/stmts,
				median(tm.perOp)/float64(w.statements),
				float64(tm.wall)/float64(base.wall),
				median(perRound),
				float64(tm.cpu.Nanoseconds())/stmts,
				float64(tm.mallocs)/stmts)
		}
	}
	checkOverheadCounters(t, dbs, 1+tpcbStatements)
	if full {
		t.Log("\n" + report.String())
	}
}

// processCPU returns the process's user plus system CPU time so far: the client's work in every
// goroutine (pgx's background reader included), the kernel's sending and receiving included.
func processCPU(t testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// BenchmarkOverhead runs every workload in every mode as sub-benchmarks named workload/mode.
// ns/op is per operation (one select, or one TPC-B transaction); ns/stmt divides by the
// statements in it. The sub-benchmarks run one after another, so compare their ratios with
// care on a busy machine; TestOverheadRounds interleaves them.
func BenchmarkOverhead(b *testing.B) {
	dsn := pgtest.Shared(b).CreateDatabase(b)
	dbs := openOverheadModes(b, dsn)
	setupPgbench(b, dbs[0].db)
	ctx := overheadContext()
	for _, w := range overheadWorkloads {
		for m, d := range dbs {
			b.Run(w.name+"/"+d.mode, func(b *testing.B) {
				rng := rand.New(rand.NewPCG(uint64(m), 2))
				for i := range 50 { // warm-up: statement caches, patterns, first EXPLAINs
					if err := w.run(ctx, d.db, rng, i); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					if err := w.run(ctx, d.db, rng, i); err != nil {
						b.Fatal(err)
					}
					i++
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(i*w.statements), "ns/stmt")
			})
		}
	}
	checkOverheadCounters(b, dbs, 1+tpcbStatements)
}
