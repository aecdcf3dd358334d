// Command instr runs a fixed number of single-row queries through one database/sql driver setup,
// so that integration/scripts/instr.sh can count the client's instructions per query with callgrind.
//
// Each run opens one connection, runs a warm-up of queries, then runs -n queries of
// `select $1::int + 1` with QueryRowContext(...).Scan and checks every answer (-workload update:
// an update of one row of a table with ExecContext instead). Running it twice
// under callgrind with different -n and dividing the difference in instructions by the difference
// in n cancels start-up, the warm-up (parsing, statement preparation, the first EXPLAIN) and
// shutdown, and leaves the client-side instructions of one query:
//
//	GODEBUG=asyncpreemptoff=1 GOMAXPROCS=1 GOGC=off valgrind --tool=callgrind \
//		instr -dsn "$DSN" -mode budget -n 2000
//
// Modes:
//
//	pgx        database/sql with pgx's stdlib connector (stdlib.OpenDB): the baseline
//	pgtraffic  pgtraffic with no rules
//	budget     pgtraffic with an enforce budget that the statement's context tag selects, with
//	           max_concurrent, server_share and burst_limit, so every statement is costed (its
//	           EXPLAIN is cached after the first), admitted and released
//	trace      pgtraffic with no rules and a recording OpenTelemetry tracer provider
//	otelsql    XSAM/otelsql around pgx's stdlib connector with the same tracer provider
//
// Every mode runs its queries with the same tagged context and the same connection (see
// waitConn), so only the driver differs. The tracer provider samples every span and hands finished spans to a processor that drops them,
// so the figures contain span creation, attributes and ending but no export.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/XSAM/otelsql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// query is the measured statement of the select workload (the smallest statement, where the
// driver's share is largest); update is the update workload's, an ExecContext on a table like
// TPC-B's statements (a table tag, a row count).
const (
	query  = "select $1::int + 1"
	update = "update instr_counter set n = n + $1 where id = 1"
)

// budgetRules selects the budget through the context tag app=instr. The limits are far above
// what one connection can use, so nothing is blocked, but server_share makes the budget need a
// cost prediction and max_concurrent a concurrency slot: the full admission path.
const budgetRules = `
budgets:
  - name: instr
    mode: enforce
    max_concurrent: 64
    server_share: 0.5
    burst_limit: 30s
rules:
  - budget: instr
    match: {app: instr}
`

var modes = []string{"pgx", "pgtraffic", "budget", "trace", "otelsql"}

func main() {
	dsn := flag.String("dsn", os.Getenv("PGTRAFFIC_TEST_DSN"), "PostgreSQL DSN (default $PGTRAFFIC_TEST_DSN)")
	mode := flag.String("mode", "pgx", "driver set-up: "+strings.Join(modes, ", "))
	n := flag.Int("n", 10000, "queries to run after the warm-up")
	// The warm-up is long because of the runtime's type-switch and type-assertion caches
	// (database/sql asserts driver interfaces on every query): a call site that misses its
	// cache adds the entry on only about one miss in 1,024 (runtime/iface.go), so after a few
	// thousand queries some sites still miss now and then, and how many of the measured
	// queries miss is luck that differs between runs: by about a hundred instructions per
	// query after 8,000 queries of warm-up, by a few tens after 30,000.
	warmup := flag.Int("warmup", 30000, "queries to run before the measured ones")
	workload := flag.String("workload", "select", "select (QueryRowContext of "+query+") or update (ExecContext of "+update+", on a temporary table)")
	flag.Parse()
	if err := run(*dsn, *mode, *workload, *n, *warmup); err != nil {
		fmt.Fprintln(os.Stderr, "instr:", err)
		os.Exit(1)
	}
}

func run(dsn, mode, workload string, n, warmup int) error {
	if dsn == "" {
		return fmt.Errorf("no DSN: pass -dsn or set PGTRAFFIC_TEST_DSN")
	}
	if n < 0 || warmup < 0 {
		return fmt.Errorf("-n and -warmup must not be negative")
	}
	db, conn, err := open(mode, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	// One connection: every query reuses the same session and pgx statement cache.
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)

	ctx := tagging.With(context.Background(), "app", "instr")
	work := queries
	switch workload {
	case "select":
	case "update":
		// A temporary table: the one connection's own, gone when it closes.
		if _, err := db.ExecContext(ctx, "create temporary table instr_counter (id int primary key, n bigint not null)"); err != nil {
			return err
		}
		if _, err := db.ExecContext(ctx, "insert into instr_counter values (1, 0)"); err != nil {
			return err
		}
		work = updates
	default:
		return fmt.Errorf("unknown workload %q (want select or update)", workload)
	}
	if err := work(ctx, db, 0, warmup); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	if err := work(ctx, db, warmup, n); err != nil {
		return err
	}
	if conn != nil {
		return checkCounters(mode, conn.Snapshot().Counters)
	}
	return nil
}

// queries runs n queries with arguments from, from+1, ... and checks each answer.
func queries(ctx context.Context, db *sql.DB, from, n int) error {
	for i := from; i < from+n; i++ {
		var got int
		if err := db.QueryRowContext(ctx, query, i).Scan(&got); err != nil {
			return fmt.Errorf("query %d: %w", i, err)
		}
		if got != i+1 {
			return fmt.Errorf("query %d: got %d, want %d", i, got, i+1)
		}
	}
	return nil
}

// updates runs n updates of one row and checks that each changed it.
func updates(ctx context.Context, db *sql.DB, from, n int) error {
	for i := from; i < from+n; i++ {
		res, err := db.ExecContext(ctx, update, 1)
		if err != nil {
			return fmt.Errorf("update %d: %w", i, err)
		}
		if rows, err := res.RowsAffected(); err != nil || rows != 1 {
			return fmt.Errorf("update %d: %d rows affected (%v), want 1", i, rows, err)
		}
	}
	return nil
}

// checkCounters makes sure the run measured the path it claims to: the budget mode must have
// costed its statements from the cached EXPLAIN (a few calls at most: the first, and one per
// plan-cache TTL on a slow run), and no mode may have blocked anything.
func checkCounters(mode string, c driver.Counters) error {
	if c.Blocked != 0 {
		return fmt.Errorf("%s: %d statements blocked", mode, c.Blocked)
	}
	if mode != "budget" {
		return nil
	}
	if c.ExplainCalls == 0 || c.ExplainCacheHits == 0 {
		return fmt.Errorf("budget: statements were not costed (EXPLAIN calls %d, cache hits %d)", c.ExplainCalls, c.ExplainCacheHits)
	}
	if c.ExplainCalls > 10 {
		return fmt.Errorf("budget: %d EXPLAIN calls; the plan cost should be cached", c.ExplainCalls)
	}
	fmt.Fprintf(os.Stderr, "instr: budget: EXPLAIN calls %d, cache hits %d, failures %d\n",
		c.ExplainCalls, c.ExplainCacheHits, c.ExplainFailures)
	return nil
}

// open returns the *sql.DB of mode, and its pgtraffic connector when it has one.
func open(mode, dsn string) (*sql.DB, *driver.Connector, error) {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, nil, err
	}
	dial := cc.DialFunc
	cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dialWaiting(ctx, dial, network, addr)
	}
	switch mode {
	case "pgx":
		return stdlib.OpenDB(*cc), nil, nil
	case "pgtraffic":
		return openPgtraffic(cc)
	case "budget":
		cfg, err := driver.ParseConfig([]byte(budgetRules))
		if err != nil {
			return nil, nil, err
		}
		return openPgtraffic(cc, driver.WithConfig(cfg))
	case "trace":
		return openPgtraffic(cc, driver.WithTracerProvider(tracerProvider()))
	case "otelsql":
		return otelsql.OpenDB(stdlib.GetConnector(*cc), otelsql.WithTracerProvider(tracerProvider())), nil, nil
	}
	return nil, nil, fmt.Errorf("unknown mode %q (want one of %s)", mode, strings.Join(modes, ", "))
}

func openPgtraffic(cc *pgx.ConnConfig, opts ...driver.Option) (*sql.DB, *driver.Connector, error) {
	c, err := driver.NewConnectorFromConfig(cc, opts...)
	if err != nil {
		return nil, nil, err
	}
	return sql.OpenDB(c), c, nil
}

// waitConn is the connection every mode measures through. Each Read first waits in the kernel
// until the server's answer has arrived, so that no read finds the socket empty. Otherwise
// whether a read comes too early (the goroutine parks, the scheduler polls the network and
// resumes it: thousands of instructions) depends on how fast the server answered, which changes
// from run to run and would swamp the driver's own instructions. The wait is a raw system call:
// the runtime is not told of it, so it does not hand the processor to another thread (which
// would again depend on how long the wait lasts). It adds the same few instructions to a query
// in every mode.
type waitConn struct {
	net.Conn
	fd int32
}

func dialWaiting(ctx context.Context, dial pgconn.DialFunc, network, addr string) (net.Conn, error) {
	conn, err := dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return conn, nil // not a socket: measured without the wait
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, err
	}
	w := &waitConn{Conn: conn}
	if err := raw.Control(func(fd uintptr) { w.fd = int32(fd) }); err != nil {
		conn.Close()
		return nil, err
	}
	return w, nil
}

// pollFd is struct pollfd of poll(2).
type pollFd struct {
	fd             int32
	events, revent int16
}

const pollIn = 0x1 // POLLIN

// waitAtMost bounds the wait: a read that pgx makes without expecting an answer (its
// background reader, started when a write is slow) must not block the one thread the
// program runs its goroutines on for longer.
const waitAtMost = 20 * time.Millisecond

func (c *waitConn) Read(b []byte) (int, error) {
	pfd := pollFd{fd: c.fd, events: pollIn}
	timeout := syscall.NsecToTimespec(int64(waitAtMost)) // ppoll writes the time left into it
	syscall.RawSyscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1, uintptr(unsafe.Pointer(&timeout)), 0, 0, 0)
	return c.Conn.Read(b)
}

// tracerProvider records every span (AlwaysSample) and drops it when it ends.
func tracerProvider() *sdktrace.TracerProvider {
	return sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithSpanProcessor(dropProcessor{}),
	)
}

// dropProcessor is a span processor that discards every span: export is not what is measured.
type dropProcessor struct{}

func (dropProcessor) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (dropProcessor) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (dropProcessor) Shutdown(context.Context) error                  { return nil }
func (dropProcessor) ForceFlush(context.Context) error                { return nil }
