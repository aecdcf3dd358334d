// Command instr runs a fixed number of single-row queries through one driver set-up (a mode),
// so that integration/scripts/instr.sh can count the client's instructions per query with callgrind.
//
// Each run opens one connection, runs a warm-up of queries, then runs -n queries of
// `select $1::int + 1` (QueryRow and Scan) and checks every answer (-workload update: an update
// of one row of a table with Exec instead). Running it twice under callgrind with different -n
// and dividing the difference in instructions by the difference in n cancels start-up, the
// warm-up (parsing, statement preparation, the first EXPLAIN) and shutdown, and leaves the
// client-side instructions of one query:
//
//	GODEBUG=asyncpreemptoff=1 GOMAXPROCS=1 GOGC=off valgrind --tool=callgrind \
//		instr -dsn "$DSN" -mode budget -n 2000
//
// Modes (-list prints each with its base, the mode it is compared with), through database/sql:
//
//	pgx        pgx's stdlib connector (stdlib.OpenDB): the base of the database/sql modes
//	control    pgx again, for the wall-time rounds' noise (see mode.control; not in -list)
//	pgtraffic  pgtraffic's connector with no rules
//	budget     pgtraffic's connector with an enforce budget that the statement's context tag
//	           selects, with max_concurrent, server_share and burst_limit, so every statement
//	           is costed (its EXPLAIN is cached after the first), admitted and released
//	trace      pgtraffic's connector with no rules and a recording OpenTelemetry tracer provider
//	otelsql    XSAM/otelsql around pgx's stdlib connector with the same tracer provider
//
// and through pgx's native interface:
//
//	pgxpool    a *pgxpool.Pool: the base of the pgx-native modes
//	poolcontrol pgxpool again, as control is pgx again
//	pool       pgtraffic's *driver.Pool with no rules
//	poolbudget pgtraffic's *driver.Pool with the budget mode's budget
//	pooltrace  pgtraffic's *driver.Pool with no rules and the tracer provider
//	otelpgx    a *pgxpool.Pool whose ConnConfig.Tracer is exaring/otelpgx's, with the same
//	           tracer provider (and without otelpgx's span per acquisition from the pool)
//
// Every mode has one connection and runs its statements with the same context (see
// statementContext) through the same connection type (see waitConn), so only the driver
// differs. The tracer provider samples every span and hands finished spans to a processor
// that drops them, so the figures contain span creation, attributes and ending but no export.
// After the run the program checks that the mode took the path it claims (see handle.check).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// query is the measured statement of the select workload (the smallest statement, where the
// driver's share is largest); update is the update workload's, an Exec on a table like
// TPC-B's statements (a table tag, a row count).
const (
	query  = "select $1::int + 1"
	update = "update instr_counter set n = n + $1 where id = 1"
)

func main() {
	dsn := flag.String("dsn", os.Getenv("PGTRAFFIC_TEST_DSN"), "PostgreSQL DSN (default $PGTRAFFIC_TEST_DSN)")
	name := flag.String("mode", "pgx", "driver set-up: "+modeNames())
	list := flag.Bool("list", false, "print each mode to count and its base, one a line, and exit")
	n := flag.Int("n", 10000, "queries to run after the warm-up")
	// The warm-up is long because of the runtime's type-switch and type-assertion caches
	// (database/sql asserts driver interfaces on every query): a call site that misses its
	// cache adds the entry on only about one miss in 1,024 (runtime/iface.go), so after a few
	// thousand queries some sites still miss now and then, and how many of the measured
	// queries miss is luck that differs between runs: by about a hundred instructions per
	// query after 8,000 queries of warm-up, by a few tens after 30,000.
	warmup := flag.Int("warmup", 30000, "queries to run before the measured ones")
	workload := flag.String("workload", "select", "select (QueryRow of "+query+") or update (Exec of "+update+", on a temporary table)")
	flag.Parse()
	if *list {
		for _, m := range modes {
			if !m.control { // the same instructions as its base
				fmt.Println(m.name, m.base)
			}
		}
		return
	}
	if err := run(*dsn, *name, *workload, *n, *warmup); err != nil {
		fmt.Fprintln(os.Stderr, "instr:", err)
		os.Exit(1)
	}
}

func run(dsn, name, workload string, n, warmup int) error {
	if dsn == "" {
		return fmt.Errorf("no DSN: pass -dsn or set PGTRAFFIC_TEST_DSN")
	}
	if n < 0 || warmup < 0 {
		return fmt.Errorf("-n and -warmup must not be negative")
	}
	m, err := lookupMode(name)
	if err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dialWaiting(ctx, dial, network, addr)
	}
	ctx, parent := statementContext()
	defer parent.End()
	h, err := open(ctx, m, cfg)
	if err != nil {
		return err
	}
	defer h.close()

	work := selectOne
	switch workload {
	case "select":
	case "update":
		// A temporary table: the one connection's own, gone when it closes.
		if _, err := h.front.exec(ctx, "create temporary table instr_counter (id int primary key, n bigint not null)"); err != nil {
			return err
		}
		if _, err := h.front.exec(ctx, "insert into instr_counter values (1, 0)"); err != nil {
			return err
		}
		work = updateOne
	default:
		return fmt.Errorf("unknown workload %q (want select or update)", workload)
	}
	for i := range warmup {
		if err := work(ctx, h.front, i); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	for i := warmup; i < warmup+n; i++ {
		if err := work(ctx, h.front, i); err != nil {
			return err
		}
	}
	if err := h.check(warmup+n, 1); err != nil {
		return err
	}
	if m.budget {
		c := h.status.Snapshot().Counters
		fmt.Fprintf(os.Stderr, "instr: %s: EXPLAIN calls %d, cache hits %d, failures %d\n",
			m.name, c.ExplainCalls, c.ExplainCacheHits, c.ExplainFailures)
	}
	return nil
}

// selectOne runs the select workload's query with argument i and checks its answer.
func selectOne(ctx context.Context, f front, i int) error {
	got, err := f.queryInt(ctx, query, i)
	if err != nil {
		return fmt.Errorf("query %d: %w", i, err)
	}
	if got != i+1 {
		return fmt.Errorf("query %d: got %d, want %d", i, got, i+1)
	}
	return nil
}

// updateOne runs the update workload's update of one row and checks that it changed it.
func updateOne(ctx context.Context, f front, i int) error {
	rows, err := f.exec(ctx, update, 1)
	if err != nil {
		return fmt.Errorf("update %d: %w", i, err)
	}
	if rows != 1 {
		return fmt.Errorf("update %d: %d rows affected, want 1", i, rows)
	}
	return nil
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
