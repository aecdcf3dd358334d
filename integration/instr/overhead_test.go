package main

import (
	"context"
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

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The overhead benchmark compares the modes of the command (see modes: database/sql with pgx's
// stdlib, pgtraffic's connector with no rules, a budget or tracing, and otelsql; pgx-native
// pgxpool, pgtraffic's pool with no rules, a budget or tracing, and otelpgx) on the same
// statements and the same database, on two workloads: a single-row select, and pgbench's
// TPC-B-like transaction (update an account, read it back, update a teller and a branch,
// insert into history). Each mode has one connection, so the figures are per-statement client
// overhead plus one round trip; each is compared with its mode's base (pgx for database/sql,
// pgxpool for the pgx-native modes).
//
// Wall-time ratios need the modes interleaved so that drift of a shared machine cancels:
// TestOverheadRounds runs rounds of modes × statements round-robin and prints the table
// (PGTRAFFIC_OVERHEAD=1 go test -v -run TestOverheadRounds . in integration/instr; make wall, and the end
// of make bench, run it with the server and the client pinned to different CPUs). Instruction counts,
// the stable figure, come from integration/scripts/instr.sh (make instr). BenchmarkOverhead has the same
// cases as ordinary sub-benchmarks, which run one after another.

// overheadModes are the modes to measure: PGTRAFFIC_OVERHEAD_MODES (names separated by spaces,
// each mode's base included), or every mode, in the order the table prints them.
func overheadModes(tb testing.TB) []mode {
	tb.Helper()
	names := strings.Fields(os.Getenv("PGTRAFFIC_OVERHEAD_MODES"))
	if len(names) == 0 {
		return modes
	}
	var ms []mode
	for _, name := range names {
		m, err := lookupMode(name)
		if err != nil {
			tb.Fatalf("PGTRAFFIC_OVERHEAD_MODES: %v", err)
		}
		ms = append(ms, m)
	}
	for _, m := range ms {
		if !slices.ContainsFunc(ms, func(b mode) bool { return b.name == m.base }) {
			tb.Fatalf("PGTRAFFIC_OVERHEAD_MODES: %s needs its base %s", m.name, m.base)
		}
	}
	return ms
}

// openOverheadModes opens every mode on dsn, one connection each.
func openOverheadModes(tb testing.TB, dsn string) []*handle {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	var hs []*handle
	for _, m := range overheadModes(tb) {
		h, err := open(context.Background(), m, cfg)
		if err != nil {
			tb.Fatalf("%s: %v", m.name, err)
		}
		tb.Cleanup(h.close)
		hs = append(hs, h)
	}
	return hs
}

// baseOf is the index in hs of the base of hs[i].
func baseOf(hs []*handle, i int) int {
	return slices.IndexFunc(hs, func(h *handle) bool { return h.mode.name == hs[i].mode.base })
}

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
func setupPgbench(tb testing.TB, f front) {
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
		if _, err := f.exec(context.Background(), s); err != nil {
			tb.Fatalf("pgbench set-up: %v", err)
		}
	}
}

// workload is one operation of a benchmark: a statement or a transaction of statements.
type workload struct {
	name       string
	statements int // statements per operation
	run        func(ctx context.Context, f front, rng *rand.Rand, i int) error
}

var overheadWorkloads = []workload{
	// The command's select (selectOne): the smallest statement, where the driver's share is largest.
	{name: "select", statements: 1, run: func(ctx context.Context, f front, _ *rand.Rand, i int) error { return selectOne(ctx, f, i) }},
	{name: "tpcb", statements: tpcbStatements, run: tpcb},
}

// tpcb is pgbench's built-in TPC-B-like script.
func tpcb(ctx context.Context, f front, rng *rand.Rand, _ int) (err error) {
	aid := rng.IntN(benchAccounts) + 1
	tid := rng.IntN(benchTellers) + 1
	bid := rng.IntN(benchBranches) + 1
	delta := rng.IntN(10_001) - 5_000
	tx, err := f.begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.rollback(ctx)
		}
	}()
	if _, err = tx.exec(ctx, "update pgbench_accounts set abalance = abalance + $1 where aid = $2", delta, aid); err != nil {
		return err
	}
	if _, err = tx.queryInt(ctx, "select abalance from pgbench_accounts where aid = $1", aid); err != nil {
		return err
	}
	if _, err = tx.exec(ctx, "update pgbench_tellers set tbalance = tbalance + $1 where tid = $2", delta, tid); err != nil {
		return err
	}
	if _, err = tx.exec(ctx, "update pgbench_branches set bbalance = bbalance + $1 where bid = $2", delta, bid); err != nil {
		return err
	}
	if _, err = tx.exec(ctx, "insert into pgbench_history (tid, bid, aid, delta, mtime) values ($1, $2, $3, $4, current_timestamp)",
		tid, bid, aid, delta); err != nil {
		return err
	}
	return tx.commit(ctx)
}

// checkOverheadModes checks every mode as the command checks its mode (handle.check), after
// the statements each ran of patterns query patterns.
func checkOverheadModes(tb testing.TB, hs []*handle, statements []int, patterns int) {
	tb.Helper()
	for i, h := range hs {
		if err := h.check(statements[i], patterns); err != nil {
			tb.Error(err)
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
// the mode's base (pgx, or pgxpool for the pgx-native modes) of the totals and the median of the per-round ratios (the figure to quote on a shared
// machine: a burst of load spoils a few rounds, not the median), and allocations per statement.
//
// Without PGTRAFFIC_OVERHEAD=1 it runs one short round, which checks that every mode and
// workload works and answers correctly, and prints nothing. With it, PGTRAFFIC_OVERHEAD_ROUNDS
// (default 100) and PGTRAFFIC_OVERHEAD_K (statements per mode per round, default 100) size the run,
// and PGTRAFFIC_OVERHEAD_MODES selects modes (see overheadModes).
func TestOverheadRounds(t *testing.T) {
	full := os.Getenv("PGTRAFFIC_OVERHEAD") == "1"
	rounds, k := 1, 25
	if full {
		rounds = envInt(t, "PGTRAFFIC_OVERHEAD_ROUNDS", 100)
		k = envInt(t, "PGTRAFFIC_OVERHEAD_K", 100)
	}
	dsn := pgtest.Shared(t).CreateDatabase(t)
	hs := openOverheadModes(t, dsn)
	setupPgbench(t, hs[0].front)
	ctx, parent := statementContext()
	defer parent.End()
	stmts := make([]int, len(hs)) // each mode's statements, for the checks

	var report strings.Builder
	fmt.Fprintf(&report, "overhead: %d rounds × %d statements per mode, GOMAXPROCS=%d\n", rounds, k, runtime.GOMAXPROCS(0))
	for _, w := range overheadWorkloads {
		ops := max(1, k/w.statements)
		totals := make([]modeTotals, len(hs))
		rngs := make([]*rand.Rand, len(hs))
		for m, h := range hs {
			rngs[m] = rand.New(rand.NewPCG(uint64(m), 1))
			// Warm-up, untimed: connection, pgx statement cache, pattern cache, first EXPLAINs.
			warm := max(ops, 50)
			for i := range warm {
				if err := w.run(ctx, h.front, rngs[m], i); err != nil {
					t.Fatalf("%s/%s warm-up: %v", w.name, h.mode.name, err)
				}
			}
			stmts[m] += (warm + rounds*ops) * w.statements
		}
		var ms runtime.MemStats
		order := rand.New(rand.NewPCG(uint64(len(w.name)), 2))
		for r := range rounds {
			// A new order every round: with a fixed or rotated one, each mode would always
			// follow the same mode, whose garbage, cache and heap footprint it would inherit
			// (the tracing modes leave the most), a bias no number of rounds removes.
			for _, m := range order.Perm(len(hs)) {
				runtime.ReadMemStats(&ms)
				mallocs := ms.Mallocs
				cpu0 := processCPU(t)
				start := time.Now()
				for i := range ops {
					if err := w.run(ctx, hs[m].front, rngs[m], r*ops+i); err != nil {
						t.Fatalf("%s/%s round %d: %v", w.name, hs[m].mode.name, r, err)
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
		fmt.Fprintf(&report, "\n%s (%d statement(s) per operation)\n", w.name, w.statements)
		fmt.Fprintf(&report, "%-12s %12s %12s %12s %12s %12s %12s\n",
			"mode", "mean ns/st", "median ns/st", "mean ratio", "median ratio", "cpu ns/st", "allocs/st")
		for m, tm := range totals {
			if tm.ops != rounds*ops {
				t.Fatalf("%s/%s: %d operations, want %d", w.name, hs[m].mode.name, tm.ops, rounds*ops)
			}
			base := &totals[baseOf(hs, m)]
			stmts := float64(tm.ops * w.statements)
			perRound := make([]float64, rounds)
			for r := range rounds {
				perRound[r] = tm.perOp[r] / base.perOp[r]
			}
			fmt.Fprintf(&report, "%-12s %12.0f %12.0f %12.3f %12.3f %12.0f %12.1f\n", hs[m].mode.name,
				float64(tm.wall.Nanoseconds())/stmts,
				median(tm.perOp)/float64(w.statements),
				float64(tm.wall)/float64(base.wall),
				median(perRound),
				float64(tm.cpu.Nanoseconds())/stmts,
				float64(tm.mallocs)/stmts)
		}
	}
	checkOverheadModes(t, hs, stmts, 1+tpcbStatements)
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
	hs := openOverheadModes(b, dsn)
	setupPgbench(b, hs[0].front)
	ctx, parent := statementContext()
	defer parent.End()
	stmts := make([]int, len(hs))
	for _, w := range overheadWorkloads {
		for m, h := range hs {
			b.Run(w.name+"/"+h.mode.name, func(b *testing.B) {
				rng := rand.New(rand.NewPCG(uint64(m), 2))
				for i := range 50 { // warm-up: statement caches, patterns, first EXPLAINs
					if err := w.run(ctx, h.front, rng, i); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					if err := w.run(ctx, h.front, rng, i); err != nil {
						b.Fatal(err)
					}
					i++
				}
				stmts[m] += (50 + i) * w.statements
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(i*w.statements), "ns/stmt")
			})
		}
	}
	checkOverheadModes(b, hs, stmts, 1+tpcbStatements)
}
