package driver

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgtraffic/pgtraffic/internal/engine"
)

// sendBatch sends b at d once the engine admits it whole (engine.BeginBatch): a refused batch
// sends nothing and every result returns the [*BlockedError]; an admitted one holds its
// budgets' slots until its results are closed. A statement queued by the name of one prepared
// in d's transaction is decided as its text (see pgxTx.Prepare). A batch of the pool is
// decided before it takes a connection, as a statement is (interceptor.run), and gives the
// connection back when it ends. The batch is sent as queued (the sqlcommenter does not rewrite
// a batch).
func (r *runner) sendBatch(ctx context.Context, d *dest, b *pgx.Batch) pgx.BatchResults {
	queries := make([]string, len(b.QueuedQueries))
	args := make([][]any, len(b.QueuedQueries))
	for i, qq := range b.QueuedQueries {
		queries[i], args[i] = named(ctx, d.text(qq.SQL), qq.Arguments)
	}
	eb := r.batches.Get().(*engine.Batch)
	q, release, err := r.beginBatch(ctx, eb, d, queries, args)
	if err != nil {
		r.batches.Put(eb)
		return pgx.FailedBatchResults(b, blocked(err))
	}
	qctx, cancel := batchOverrunContext(ctx, eb) // max_duration: its results are read under qctx
	w := &pgxBatch{run: r, b: eb, ctx: ctx, qctx: qctx, cancel: cancel, release: release, errs: make([]error, len(queries)),
		queued: b.QueuedQueries}
	sent := false
	defer func() {
		if !sent {
			w.end(errPanicked) // pgx's SendBatch panicked
		}
	}()
	w.BatchResults = q.SendBatch(qctx, b)
	sent = true
	if t := w.BatchResults.Tx(); t != nil {
		// The batch began a transaction (pgx.Batch.BeginTx): as under pgxpool, the connection
		// is released when the transaction ends, not when the results are closed.
		w.tx = &pgxTx{Tx: t, run: r, prepared: map[string]string{}, release: w.release}
		w.release = nil
	}
	return w
}

// beginBatch decides the batch of queries with args into eb at d, as interceptor.run decides
// a statement (decideForPool on the pool), and returns
// where to send it and, when it took a connection from the pool, what gives it back. On nil
// eb must be finished.
func (r *runner) beginBatch(ctx context.Context, eb *engine.Batch, d *dest, queries []string, args [][]any) (
	q querier, release releaser, err error) {
	e := r.c.engine
	if d.pool == nil {
		return d.held(), nil, e.BeginBatch(ctx, eb, explainOn(d.conn), queries, args)
	}
	_, q, release, err = decideForPool(ctx, d.pool, decidedBatch{eb},
		func() (context.Context, error) { return ctx, e.BeginBatchBeforeConn(ctx, eb, queries, args) },
		func(conn *pgx.Conn) (context.Context, error) {
			return ctx, e.BeginBatchTaken(ctx, eb, explainOn(conn), queries, args)
		})
	return q, release, err
}

// pgxBatch are the results of an admitted batch: pgx's, whose batch is finished and whose pool
// connection is released, once, when they are closed. Like pgx's results they are used by one
// goroutine.
type pgxBatch struct {
	pgx.BatchResults
	run     *runner
	b       *engine.Batch // nil once ended
	ctx     context.Context
	qctx    context.Context // what it runs under: ctx, or ctx with max_duration (batchOverrunContext)
	cancel  func()          // releases qctx's timer; nil without max_duration
	release releaser
	tx      *pgxTx  // the transaction the batch began; nil if none
	errs    []error // each statement's outcome as its result was read, for its span
	next    int     // the next result to read
	// queued are the batch's queries, whose callbacks (QueuedQuery.Query, QueryRow, Exec) Close
	// runs on these results rather than pgx's (see Close).
	queued []*pgx.QueuedQuery
}

var _ pgx.BatchResults = (*pgxBatch)(nil)

// note records the outcome of the result just read.
func (w *pgxBatch) note(err error) {
	if w.next < len(w.errs) {
		w.errs[w.next] = err
	}
	w.next++
}

// Each error matches ErrOverrun when max_duration cancelled the batch, those handed to the
// queued queries' callbacks included (Close runs them on these methods).

func (w *pgxBatch) Exec() (pgconn.CommandTag, error) {
	tag, err := w.BatchResults.Exec()
	err = overran(w.qctx, err)
	w.note(err)
	return tag, err
}

func (w *pgxBatch) Query() (pgx.Rows, error) {
	rows, err := w.BatchResults.Query()
	err = overran(w.qctx, err)
	w.note(err)
	if w.cancel != nil {
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
func (w *pgxBatch) Close() (err error) {
	err = errPanicked
	defer func() { w.end(err) }()
	if w.b != nil {
		defer w.throughWrapper()()
	}
	err = w.BatchResults.Close()
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

// end finishes the batch, the first time only: err is the batch's outcome, the outcome of the
// statements whose result was not read.
func (w *pgxBatch) end(err error) {
	b := w.b
	if b == nil {
		return
	}
	w.b = nil
	defer func() {
		if w.cancel != nil {
			w.cancel()
		}
		if w.release != nil {
			w.release.Release()
		}
	}()
	for i := w.next; i < len(w.errs); i++ {
		w.errs[i] = err
	}
	b.Finish(w.ctx, w.errs)
	w.run.batches.Put(b)
}

// Tx returns the transaction the batch began (pgx.Batch.BeginTx), controlled as a
// [Pool.Begin] transaction is; nil when the batch began none.
func (w *pgxBatch) Tx() pgx.Tx {
	if w.tx == nil {
		return nil
	}
	return w.tx
}
