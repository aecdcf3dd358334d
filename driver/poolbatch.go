package driver

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgtraffic/pgtraffic/internal/engine"
)

// sendBatch sends b at d once the engine admits it whole (engine.BeginBatch), as a job of
// interceptor.run: a refused batch sends nothing and every result returns the
// [*BlockedError]; an admitted one holds its budgets' slots until its results are closed. A
// statement queued by the name of one prepared in d's transaction is decided as its text (see
// pgxTx.Prepare). A batch of the pool is decided before it takes a connection, as a statement
// is, and gives the connection back when it ends. The batch is sent as queued, or with the
// sqlcommenter's comments in a copy (outgoingBatch).
func (r *runner) sendBatch(ctx context.Context, d *dest, b *pgx.Batch) pgx.BatchResults {
	j := r.batches.Get().(*batchJob)
	decided := b.QueuedQueries
	if beginsTx(b) {
		// Its first query is the BEGIN pgx queued (pgx.Batch.BeginTx): not decided, as
		// Pool.BeginTx's is not (it costs the server nothing). Its result is the batch's first.
		decided, j.skip = decided[1:], 1
	}
	n := len(decided)
	j.queries, j.args, j.errs = make([]string, n), make([][]any, n), make([]error, n)
	for i, qq := range decided {
		j.queries[i], j.args[i] = named(ctx, d.text(qq.SQL), qq.Arguments)
	}
	w := &pgxBatch{open: openStmt{j: j}, job: j, queued: b.QueuedQueries}
	err := r.c.intr.run(ctx, &w.open, d, true, func(q querier, qctx context.Context) error {
		w.qctx = qctx // its results are read under it
		sent := r.c.intr.outgoingBatch(ctx, d, j, b)
		w.queued = sent.QueuedQueries // pgx runs the callbacks of the queries it was sent
		w.BatchResults = q.SendBatch(qctx, sent)
		return nil // pgx's results return the errors
	})
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	if t := w.BatchResults.Tx(); t != nil {
		// The batch began a transaction (pgx.Batch.BeginTx): as under pgxpool, the connection
		// is released when the transaction ends, not when the results are closed.
		w.tx = &pgxTx{Tx: t, run: r, prepared: map[string]string{}, release: w.open.release}
		w.open.release = nil
	}
	return w
}

// errBatchGivenUp is what the results of a batch answer once a panic in their Close ended it.
var errBatchGivenUp = errors.New("pgtraffic: the batch ended when its Close panicked; its results were given up with its connection")

// beginsTx reports whether b begins a transaction (pgx.Batch.BeginTx), which pgx tells by the
// results of a batch that failed: a closed transaction rather than none.
func beginsTx(b *pgx.Batch) bool { return pgx.FailedBatchResults(b, nil).Tx() != nil }

// batchJob is a pgx batch as interceptor.run takes it: its engine.Batch, decided whole, the
// texts and arguments it is decided by, and each statement's outcome as its result is read.
// Reused from one batch to the next (runner.batches).
type batchJob struct {
	// Batch is the batch's engine ticket, whose Acquired, Abandon and Deadline are the job's; its
	// Finish is called by the job's finish.
	engine.Batch
	queries []string
	args    [][]any
	errs    []error // each statement's outcome as its result was read, for its span
	next    int     // the next result to read
	skip    int     // the results before the first decided statement's: the BEGIN of a BeginTx batch
	home    *sync.Pool
}

func (j *batchJob) fingerprint() string {
	if len(j.Execs) == 0 {
		return ""
	}
	return fingerprintOf(&j.Execs[0])
}

func (j *batchJob) begin(ctx context.Context, e *engine.Engine, at place, conn *pgx.Conn) (context.Context, error) {
	switch at {
	case beforeConn:
		return ctx, e.BeginBatchBeforeConn(ctx, &j.Batch, j.queries, j.args)
	case onTaken:
		return ctx, e.BeginBatchTaken(ctx, &j.Batch, explainOn(conn), j.queries, j.args)
	}
	return ctx, e.BeginBatch(ctx, &j.Batch, explainOn(conn), j.queries, j.args)
}

// Held is how long the engine held the batch back on its connection: as long as its
// statements, which share its clock.
func (j *batchJob) Held() time.Duration {
	for i := range j.Execs {
		if h := j.Execs[i].Held(); h > 0 {
			return h
		}
	}
	return 0
}

// note records the outcome of the result just read.
func (j *batchJob) note(err error) {
	if i := j.next - j.skip; i >= 0 && i < len(j.errs) {
		j.errs[i] = err
	}
	j.next++
}

// finish finishes the batch: err is its outcome, that of the statements whose result was not
// read.
func (j *batchJob) finish(ctx context.Context, err error) {
	for i := max(j.next-j.skip, 0); i < len(j.errs); i++ {
		j.errs[i] = err
	}
	j.Finish(ctx, j.errs)
	j.done()
}

func (j *batchJob) done() {
	j.queries, j.args, j.errs, j.next, j.skip = nil, nil, nil, 0, 0
	j.home.Put(j)
}

// pgxBatch are the results of an admitted batch: pgx's, whose batch is finished and whose pool
// connection is released, once, when they are closed. Like pgx's results they are used by one
// goroutine.
type pgxBatch struct {
	pgx.BatchResults
	open openStmt
	job  *batchJob       // the batch, to note each result's outcome while open is in flight
	qctx context.Context // what it runs under: ctx, or ctx with max_duration (overrunContext)
	tx   *pgxTx          // the transaction the batch began; nil if none
	// gaveUp: Close panicked, and the batch ended with pgx's results mid-read (see Close).
	gaveUp bool
	// queued are the batch's queries, whose callbacks (QueuedQuery.Query, QueryRow, Exec) Close
	// runs on these results rather than pgx's (see Close).
	queued []*pgx.QueuedQuery
}

var _ pgx.BatchResults = (*pgxBatch)(nil)

// note records the outcome of the result just read, while the batch is in flight.
func (w *pgxBatch) note(err error) {
	if w.open.inFlight() {
		w.job.note(err)
	}
}

// Each error matches ErrOverrun when max_duration cancelled the batch, those handed to the
// queued queries' callbacks included (Close runs them on these methods).

func (w *pgxBatch) Exec() (pgconn.CommandTag, error) {
	if w.gaveUp {
		return pgconn.CommandTag{}, errBatchGivenUp
	}
	tag, err := w.BatchResults.Exec()
	err = overran(w.qctx, err)
	w.note(err)
	return tag, err
}

func (w *pgxBatch) Query() (pgx.Rows, error) {
	if w.gaveUp {
		return errRows{err: errBatchGivenUp}, errBatchGivenUp
	}
	rows, err := w.BatchResults.Query()
	err = overran(w.qctx, err)
	w.note(err)
	if w.open.cancel != nil {
		rows = &batchRows{Rows: rows, qctx: w.qctx}
	}
	return rows, err
}

// batchRows are the rows of a batch run under max_duration: pgx's, with an error that matches
// ErrOverrun when the bound cancelled them.
type batchRows struct {
	pgx.Rows
	qctx context.Context
}

func (r *batchRows) Err() error { return overran(r.qctx, r.Rows.Err()) }

func (w *pgxBatch) QueryRow() pgx.Row {
	rows, err := w.Query()
	return &batchRow{rows: rows, err: err}
}

// batchRow is the row of a batch's QueryRow: it reads the batch's rows (pgx has no public row
// over given rows), which the batch ends when its results are closed.
type batchRow struct {
	rows pgx.Rows // the result's rows (pgx's, or batchRows under max_duration)
	err  error
}

var _ pgx.Row = (*batchRow)(nil)

// Scan scans the first row into dest, as pgx's Row does: pgx.ErrNoRows when there is none, the
// result's error (a [*BlockedError] when the batch was refused) when it failed.
func (r *batchRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	rows := r.rows
	defer rows.Close()
	for _, d := range dest {
		if _, ok := d.(*pgtype.DriverBytes); ok {
			// As pgx's Row: the bytes would outlive the rows, closed when Scan returns.
			return errors.New("pgtraffic: cannot scan into *pgtype.DriverBytes from QueryRow")
		}
	}
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// Close closes pgx's results (running the callbacks of the results not read), then finishes
// the batch and releases its connection, even if pgx's Close panics.
//
// pgx's Close runs the callbacks of the unread results (QueuedQuery.Query, QueryRow, Exec) on
// its own results, whose errors do not match ErrOverrun. So, the first time, each callback is
// made to read through w instead, for the duration of pgx's Close: pgx keeps its semantics
// (the order, no callback after the first error, Close's error, no callback run again by a
// second Close), and a callback's statement is read as by w's Exec, Query or QueryRow, its
// error matching ErrOverrun when max_duration cut the batch off, and noted for its span. The
// batch's callbacks are given back before Close returns, even if one panics.
//
// A panic in Close (a callback's) ends the batch and gives its connection back while pgx's
// results are mid-read on it (pgxpool destroys it, busy): from then on every method answers
// errBatchGivenUp and reads nothing from pgx's results, a second Close included.
func (w *pgxBatch) Close() (err error) {
	if w.gaveUp {
		return errBatchGivenUp
	}
	err = errPanicked
	closed := false
	defer func() {
		w.gaveUp = !closed
		w.open.finish(err)
	}()
	if w.open.inFlight() {
		defer w.throughWrapper()()
	}
	err = w.BatchResults.Close()
	closed = true
	if _, ok := err.(*overrunError); !ok { // a callback's error, read through w, matches already
		err = overran(w.qctx, err)
	}
	return err
}

// throughWrapper makes the callbacks of w's queued queries read their results through w, and
// returns what gives them back their own.
func (w *pgxBatch) throughWrapper() (restore func()) {
	var saved []func(pgx.BatchResults) error
	for i, qq := range w.queued {
		if qq.Fn == nil {
			continue
		}
		if saved == nil {
			saved = make([]func(pgx.BatchResults) error, len(w.queued))
		}
		fn := qq.Fn
		saved[i] = fn
		qq.Fn = func(pgx.BatchResults) error { return fn(w) }
	}
	return func() {
		for i, fn := range saved {
			if fn != nil {
				w.queued[i].Fn = fn
			}
		}
	}
}

// Tx returns the transaction the batch began (pgx.Batch.BeginTx), controlled as a
// [Pool.Begin] transaction is; nil when the batch began none.
func (w *pgxBatch) Tx() pgx.Tx {
	if w.tx == nil {
		return nil
	}
	return w.tx
}
