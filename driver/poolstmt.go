package driver

import (
	"context"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/internal/engine"
)

// releaser gives a pool's connection back when its statement, batch or transaction ends: the
// *pgxpool.Conn it was acquired as (a fake in unit tests). An interface rather than a func: the
// method value pc.Release would be an allocation per statement.
type releaser interface{ Release() }

// querier is where a pgx-native statement is sent: a *pgx.Conn (acquired from the pool, or
// held), or a pgx.Tx. A fake in unit tests.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
}

// connPool is where a statement of the [Pool] takes its connection once it is admitted: the
// *pgxpool.Pool (poolConns), a fake in unit tests. The connection is sent to through q (in
// production the *pgx.Conn itself, which EXPLAIN runs on too), and given back through release.
type connPool interface {
	acquire(ctx context.Context) (q querier, release releaser, err error)
}

// poolConns is a *pgxpool.Pool as a connPool.
type poolConns struct{ p *pgxpool.Pool }

func (c poolConns) acquire(ctx context.Context) (querier, releaser, error) {
	pc, err := c.p.Acquire(ctx)
	if err != nil {
		return nil, nil, closedPool(err)
	}
	return pc.Conn(), pc, nil
}

// acquireAdmitted takes a connection from pool for a, admitted before it had one under ctx
// (the context BeginBeforeConn returned): once a has it, a's clock restarts (the wait for the
// pool is not its cost) and its pending slots become running ones (Acquired). Statements on
// held connections may have overtaken those slots while it waited: then a is admitted again on
// its connection, and may wait for capacity or be refused. If no connection comes (the context
// ended, the pool closed), Acquired refuses a, or the pool's hook or the engine's observer
// panics, a is abandoned: its slots go back at no cost, as does the connection it took. The
// error is the pool's, or Acquired's refusal (a *engine.Denial, or ctx's error), or
// engine.ErrWaitBeforeConn when a health threshold held a back on its connection, or
// errConnClosed when that connection closed while a waited on it for room: the caller decides
// it again before it takes one.
//
// When the rules were replaced while a waited for room on its connection, Acquired returns
// engine.ErrDecideAgain: a is abandoned (its first decision ends there), and acquireAdmitted
// returns that error with the connection still held, which the caller decides the statement
// again on with decideOn, as one that took its connection first.
func acquireAdmitted(ctx context.Context, pool connPool, a job) (q querier, release releaser, err error) {
	ran := false
	var conn releaser // the connection taken, for the deferred call: the results are nil on an error
	defer func() {
		if ran {
			return
		}
		if conn != nil && err != engine.ErrDecideAgain {
			conn.Release() // before Abandon: a refused statement holds no connection
		}
		a.Abandon(ctx, abandoned(err)) // nothing ran
	}()
	err = errPanicked
	if q, conn, err = pool.acquire(ctx); err != nil {
		return nil, nil, err
	}
	err = errPanicked
	switch err = a.Acquired(ctx); err {
	case nil:
		// Overtaken, a may have waited on the connection for room: the server, or a proxy,
		// may have closed it meanwhile (checkConn). Then a is abandoned unsent, the
		// connection goes back, and the caller decides a again before one (errConnClosed).
		pc, _ := q.(*pgx.Conn) // a fake in unit tests

		err = errPanicked // until checkConn returns: its ping may panic
		if err = checkConn(ctx, pc, a.Held()); err != nil {
			return nil, nil, err
		}
		ran = true
		return q, conn, nil
	case engine.ErrDecideAgain:
		return q, conn, err // abandoned by the deferred call; the connection stays the caller's
	}
	return nil, nil, err
}

// acquireExplained takes a connection from pool for a job j whose cost needs an EXPLAIN on it,
// and decides it there in the engine e, as decideOn does. A job that cannot take one (its
// context ended, the pool closed) ends undecided, with the pool's error.
func acquireExplained(ctx context.Context, pool connPool, e *engine.Engine, j job) (context.Context, querier, releaser, error) {
	q, release, err := pool.acquire(ctx)
	if err != nil {
		j.EndUndecided(ctx, err)
		return nil, nil, nil, err
	}
	return decideOn(ctx, q, release, e, j)
}

// decideOn decides a job j in the engine e on the connection q it holds (release gives it
// back), as one taken for it alone (onTaken): one whose cost needs an EXPLAIN there, or one
// admitted before it had a connection whose rules were replaced meanwhile
// (engine.ErrDecideAgain). It returns the context j's begin returned. The connection goes back
// at once if the engine refuses j (or panics), or answers engine.ErrWaitBeforeConn.
//
// The connection is pgtraffic's choice, not the caller's: one that closed while the engine
// held j back there (its EXPLAIN failed with it, or the server closed it idle while j waited
// for capacity: checkConn) goes back too, j is abandoned unsent, at no cost, and decideOn
// returns errConnClosed: the caller decides j again before a connection, as a new statement,
// and it takes another one.
func decideOn(ctx context.Context, q querier, release releaser, e *engine.Engine, j job) (
	sctx context.Context, _ querier, _ releaser, err error) {
	decided := false
	defer func() {
		if !decided {
			release.Release()
		}
	}()
	conn, _ := q.(*pgx.Conn) // a fake in unit tests: no EXPLAIN
	if sctx, err = j.begin(ctx, e, onTaken, conn); err != nil {
		return nil, nil, nil, err
	}
	if err = checkConn(sctx, conn, j.Held()); err != nil {
		j.Abandon(sctx, abandoned(err))
		return nil, nil, nil, err
	}
	decided = true
	return sctx, q, release, nil
}

// runner puts the statements of a [Pool], of its connections and of its transactions through
// the engine (interceptor.run), and keeps the engine's tickets for reuse, and the names of the
// statements prepared on the pool's connections. Safe for concurrent use.
type runner struct {
	c       *core
	tickets sync.Pool // *ticket, finished
	batches sync.Pool // *batchJob, finished
	names   preparedNames
}

func newRunner(c *core) *runner {
	r := &runner{c: c}
	r.names.log = c.log
	r.tickets.New = func() any { return &ticket{home: &r.tickets} }
	r.batches.New = func() any { return &batchJob{home: &r.batches} }
	return r
}

// rowSlab is how many rows a ticket's slab holds: one allocation per rowSlab QueryRows, and
// a row kept by its caller keeps at most its slab.
const rowSlab = 32

// row returns a row of t's slab, never handed out before.
func (t *ticket) row() *pgxRow {
	if len(t.rows) == 0 {
		t.rows = make([]pgxRow, rowSlab)
	}
	row := &t.rows[0]
	t.rows = t.rows[1:]
	return row
}

// ticket returns a finished ticket.
func (r *runner) ticket() *ticket { return r.tickets.Get().(*ticket) }

// exec runs an Exec of sql at d.
func (r *runner) exec(ctx context.Context, d *dest, sql string, args []any) (tag pgconn.CommandTag, err error) {
	text := d.text(sql)
	t := r.ticket().statement(ctx, text, args)
	o := openStmt{j: t}
	err = r.c.intr.run(ctx, &o, d, false, func(q querier, qctx context.Context) (err error) {
		tag, err = q.Exec(qctx, r.c.intr.outgoing(&o, t, sql, text != sql), args...)
		return err
	})
	return tag, err
}

// query runs a Query of sql at d; its rows finish the statement when they end.
func (r *runner) query(ctx context.Context, d *dest, sql string, args []any) (pgx.Rows, error) {
	w := newPgxRows(r.c.intr.leaks)
	text := d.text(sql)
	t := r.ticket().statement(ctx, text, args)
	w.open.j = t
	err := r.c.intr.run(ctx, w.open, d, true, func(q querier, qctx context.Context) (err error) {
		w.qctx = qctx
		w.Rows, err = q.Query(qctx, r.c.intr.outgoing(w.open, t, sql, text != sql), args...)
		return err
	})
	if err != nil {
		if d.pool != nil {
			return errRows{err: err}, err // its connection went back to the pool, as pgxpool's does
		}
		return errRows{err: err, of: w.Rows}, err
	}
	return w, nil
}

// queryRow runs a QueryRow of sql at d with pgx's own QueryRow, whose row's Scan finishes the
// statement (pgxRow). The row comes from the ticket's slab (ticket.row).
func (r *runner) queryRow(ctx context.Context, d *dest, sql string, args []any) pgx.Row {
	text := d.text(sql)
	t := r.ticket().statement(ctx, text, args)
	row := t.row()
	row.open.j = t
	row.err = r.c.intr.run(ctx, &row.open, d, true, func(q querier, qctx context.Context) error {
		row.row = q.QueryRow(qctx, r.c.intr.outgoing(&row.open, t, sql, text != sql), args...)
		return nil // pgx's row returns the error from Scan
	})
	return row
}

// copyFrom runs a CopyFrom at d. The engine decides it as the COPY statement pgx sends for it
// (copyText), which pg_query identifies as kind copy with its table: so it carries the built-in
// tags statement=copy and table=<name>, its cost is learned per table and columns, until known
// it is reserved as any unknown cost is (EXPLAIN cannot cost a COPY), and it runs under its
// budgets' max_duration as any statement does.
func (r *runner) copyFrom(ctx context.Context, d *dest, table pgx.Identifier, columns []string,
	src pgx.CopyFromSource) (n int64, err error) {
	o := openStmt{j: r.ticket().statement(ctx, copyText(table, columns), nil)}
	err = r.c.intr.run(ctx, &o, d, false, func(q querier, qctx context.Context) (err error) {
		n, err = q.CopyFrom(qctx, table, columns, boundedSource{src, qctx})
		return err
	})
	return n, err
}

// boundedSource is a copy's source read under ctx, what the copy runs under: once ctx ends
// (its max_duration passed, or the caller's context ended) it has no more rows, and its error
// is ctx's. pgx reads a source to its end before it sends what it buffered, and so before it
// notices that its context ended: a slow source (rows streamed from elsewhere) would run on
// past max_duration, holding its budget's slot.
type boundedSource struct {
	pgx.CopyFromSource
	ctx context.Context
}

func (s boundedSource) Next() bool { return s.ctx.Err() == nil && s.CopyFromSource.Next() }

func (s boundedSource) Err() error {
	if err := s.ctx.Err(); err != nil {
		return err
	}
	return s.CopyFromSource.Err()
}

// copyText is the statement the engine decides for a CopyFrom of columns into table: the text
// pgx sends for it (pgx.Conn.CopyFrom), so that its fingerprint is the one of its text in
// pg_stat_activity and pg_stat_statements, which an operator may block it by.
func copyText(table pgx.Identifier, columns []string) string {
	var b strings.Builder
	b.WriteString("copy ")
	b.WriteString(table.Sanitize())
	b.WriteString(" ( ")
	for i, c := range columns {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(`"` + strings.ReplaceAll(c, `"`, `""`) + `"`) // as pgx quotes a column
	}
	b.WriteString(" ) from stdin binary;")
	return b.String()
}
