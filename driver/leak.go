package driver

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/pgtraffic/pgtraffic/internal/engine"
	"github.com/pgtraffic/pgtraffic/internal/loglimit"
)

// Rows that the application never closes hold their statement's concurrency slots for good:
// database/sql closes rows only when they are exhausted, when Close is called, or when the
// query's context ends (a goroutine of database/sql watches a context that can end), and it sets
// no finalizer. With context.Background, N forgotten Close calls wedge a max_concurrent: N budget.
//
// So each rows wrapper carries a cleanup (runtime.AddCleanup): once the wrapper is garbage,
// which for leaked rows happens when the application drops its *sql.Rows, the cleanup counts it
// in pgtraffic.rows.leaked, finishes the statement as Close would have (releasing its slots and
// debt) and logs a warning, recovering a panic of the application's code (see reclaim). The
// cleanup's argument is the statement's openStmt (run.go), never the wrapper (which would then
// stay reachable and never be collected); the wrapper points to the openStmt, not the other way
// round. The pgx rows and the connection stay
// with database/sql, which holds the connection as in use for ever: only the budget's slot comes
// back. The pgx-native pool's rows carry the same cleanup (poolrows.go).
//
// Not reclaimable: rows of a prepared *sql.Stmt (database/sql keeps them in the statement's
// dependency list until closed) and rows whose context never ends but is not Background (its
// watcher goroutine keeps them alive).

// errRowsLeaked is the error a leaked statement finishes with: not a success, so the cost model
// does not learn from a duration that measured the garbage collector.
var errRowsLeaked = errors.New("pgtraffic: rows garbage-collected without Close")

// reclaim finishes o's statement, whose rows were collected while still open, and reports it
// with the warning msg.
//
// It runs on the runtime's cleanup goroutine, which has no caller to return a panic to: a panic
// there ends the process. And it reaches the application's code: its meter (the counter), its
// span processors (Finish ends the statement's span) and its logger. So each of the three runs
// under userCode, which recovers a panic, and the slot comes back before the warning is logged,
// so that a logger that panics or stalls cannot keep it. The order is a choice: the count
// (the atomic and pgtraffic.rows.leaked) comes before the slot, so that whoever sees the slot
// back also sees the leak counted; the warning comes after it, so a reader of the log may see
// the slot back before the warning. A meter that stalls in Add still delays the slot: the
// OpenTelemetry SDK's counters do not block, and the count is worth that.
func (o *openStmt) reclaim(msg string) {
	if !o.inFlight() {
		return // closed or exhausted: nothing held
	}
	ctx, lk, fp := o.ctx, o.leaks, o.j.fingerprint() // finish clears o, and gives the job back for reuse
	lk.userCode(func() { lk.count(ctx) })
	// finish gives the slot back even if the span processors panic: the engine releases the
	// holds before it calls its observer, and finish defers the connection's release.
	lk.userCode(func() { o.finish(errRowsLeaked) })
	lk.userCode(func() { lk.warn(ctx, msg, fp) })
}

// reclaimSQL and reclaimPgx are the cleanups of the rows of each front end.
func reclaimSQL(o *openStmt) { o.reclaim(leakedSQLRows) }
func reclaimPgx(o *openStmt) { o.reclaim(leakedPgxRows) }

// sqlRowsStmt is a database/sql rows wrapper's statement with the ticket the wrapper keeps for
// it, allocated together.
type sqlRowsStmt struct {
	open openStmt
	t    ticket
}

// newRows returns a rows wrapper with its leak cleanup attached.
func newRows(lk *leaks) *rows {
	s := &sqlRowsStmt{open: openStmt{leaks: lk}}
	r := &rows{open: &s.open, own: &s.t}
	runtime.AddCleanup(r, reclaimSQL, r.open)
	return r
}

// leaks counts and reports reclaimed statements; shared by a connector's connections. Safe for
// concurrent use.
type leaks struct {
	n       atomic.Int64
	counter metric.Int64Counter // nil: not counted as a metric
	log     *slog.Logger
	limit   loglimit.Limiter // a line a second (rows leaked in a loop)
}

func newLeaks(meter metric.Meter, log *slog.Logger) (*leaks, error) {
	if log == nil {
		log = slog.Default()
	}
	lk := &leaks{log: log}
	c, err := meter.Int64Counter(metricRowsLeaked,
		metric.WithUnit("{statement}"),
		metric.WithDescription("Statements whose rows were garbage-collected without Close; their budget slots were reclaimed."))
	if err != nil {
		return nil, telemetryError(err)
	}
	lk.counter = c
	return lk, nil
}

// The warnings of a reclaimed statement, by front end.
const (
	leakedSQLRows = "pgtraffic: rows garbage-collected without Close; their budget slots are reclaimed, but database/sql keeps the connection in use: close every *sql.Rows"
	leakedPgxRows = "pgtraffic: rows garbage-collected without Close; their budget slots are reclaimed and, outside a transaction, their pool connection destroyed: close every pgx.Rows"
)

// count counts a reclaimed statement: in n, then in pgtraffic.rows.leaked (the application's
// meter).
func (lk *leaks) count(ctx context.Context) {
	if lk == nil {
		return
	}
	lk.n.Add(1)
	if lk.counter != nil {
		lk.counter.Add(ctx, 1)
	}
}

// warn logs a reclaimed statement's warning msg with the application's logger, naming the
// statement by its fingerprint fp when known, at most a line a second with how many were
// suppressed (pgtraffic.rows.leaked counts every one).
func (lk *leaks) warn(ctx context.Context, msg, fp string) {
	if lk == nil {
		return
	}
	ok, suppressed := lk.limit.Allow("", time.Now())
	if !ok {
		return
	}
	var attrs []slog.Attr
	if fp != "" {
		attrs = append(attrs, engine.FingerprintAttr(fp))
	}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("suppressed", suppressed))
	}
	lk.log.LogAttrs(ctx, slog.LevelWarn, msg, attrs...)
}

// userCode runs f, which reaches the application's code, on the cleanup goroutine, and
// recovers its panic: there is no caller to hand it to, and the process must survive a leaked
// rows. The panic is logged, once and under the same guard, as an error; a logger that panics
// again is left at that.
func (lk *leaks) userCode(f func()) {
	defer func() {
		if p := recover(); p != nil && lk != nil {
			defer func() { _ = recover() }()
			lk.log.LogAttrs(context.Background(), slog.LevelError,
				"pgtraffic: the application's code (logger, meter or span processor) panicked while rows garbage-collected without Close were reclaimed; the panic was recovered",
				slog.Any("panic", p))
		}
	}()
	f()
}
