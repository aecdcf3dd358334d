package driver

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"sync/atomic"

	"go.opentelemetry.io/otel/metric"
)

// Rows that the application never closes hold their statement's concurrency slots for good:
// database/sql closes rows only when they are exhausted, when Close is called, or when the
// query's context ends (a goroutine of database/sql watches a context that can end), and it sets
// no finalizer. With context.Background, N forgotten Close calls wedge a max_concurrent: N budget.
//
// So each rows wrapper carries a cleanup (runtime.AddCleanup): once the wrapper is garbage,
// which for leaked rows happens when the application drops its *sql.Rows, the cleanup finishes
// the statement as Close would have (releasing its slots and debt), counts it in
// pgtraffic.rows.leaked and logs a warning. The cleanup's argument is the statement's openStmt
// (run.go), never the wrapper (which would then stay reachable and never be collected); the
// wrapper points to the openStmt, not the other way round. The pgx rows and the connection stay
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
func (o *openStmt) reclaim(msg string) {
	if !o.inFlight() {
		return // closed or exhausted: nothing held
	}
	// Reported before the slots come back, so that whoever sees them back also sees the report.
	o.leaks.report(o.ctx, msg)
	o.finish(errRowsLeaked)
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

// report counts a reclaimed statement and logs msg.
func (lk *leaks) report(ctx context.Context, msg string) {
	if lk == nil {
		return
	}
	lk.n.Add(1)
	if ctx == nil {
		ctx = context.Background()
	}
	if lk.counter != nil {
		lk.counter.Add(ctx, 1)
	}
	lk.log.LogAttrs(ctx, slog.LevelWarn, msg)
}
