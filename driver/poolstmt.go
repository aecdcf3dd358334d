package driver

import (
	"context"
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

// querier is where a pgx-native statement is sent: a *pgx.Conn acquired from the pool, or a
// pgx.Tx. A fake in unit tests.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
}

// connPool is where a statement of the [Pool] takes its connection once it is admitted: the
// *pgxpool.Pool (poolConns), a fake in unit tests. The connection is sent to through q, explained
// on through conn, and given back through release.
type connPool interface {
	acquire(ctx context.Context) (q querier, conn *pgx.Conn, release releaser, err error)
}

// poolConns is a *pgxpool.Pool as a connPool.
type poolConns struct{ p *pgxpool.Pool }

func (c poolConns) acquire(ctx context.Context) (querier, *pgx.Conn, releaser, error) {
	pc, err := c.p.Acquire(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	return pc.Conn(), pc.Conn(), pc, nil
}

// dest is where a statement runs: on a connection its caller holds (a [PoolConn]'s, a
// transaction's: conn, and q when the statement is sent through something else, a pgx.Tx), or
// on one it takes from the pool once it is admitted (pool), which it gives back when it ends.
type dest struct {
	pool connPool  // nil when the connection is held
	q    querier   // where a held connection's statement is sent; nil: conn
	conn *pgx.Conn // the held connection, for EXPLAIN; nil in unit tests (no EXPLAIN)
}

// held is the destination of a statement on conn, held by its caller.
func held(conn *pgx.Conn) dest { return dest{conn: conn} }

// runner puts the statements of a [Pool] and of its transactions through the engine: each is
// decided, then sent through a querier, and finished when it completes. A statement of the
// pool itself is decided before it takes a connection from the pool (dest.begin), so that a
// refused statement never waits for one and a statement waiting for capacity holds none. It
// keeps the engine's per-statement tickets for reuse (pgxpool has no per-connection state to
// keep one in). Safe for concurrent use.
type runner struct {
	c       *core
	tickets sync.Pool // *ticket, finished
	batches sync.Pool // *engine.Batch, finished
}

func newRunner(c *core) *runner {
	return &runner{c: c,
		tickets: sync.Pool{New: func() any { return &ticket{e: c.engine} }},
		batches: sync.Pool{New: func() any { return new(engine.Batch) }},
	}
}

// ticket is one statement's engine ticket, kept by the runner for the next statement, and the
// storage of the rows its QueryRow hands out. pgxpool hands out its rows from slabs kept per
// connection, so that a QueryRow allocates nothing; pgxpool keeps nothing of ours per
// connection, so the slabs are kept in the tickets.
type ticket struct {
	x    engine.Exec
	rows []pgxRow // the rest of a slab: each row is handed out once, never reused
	// e, text and args are what its decision needs (ticket.begin); args only while it is made.
	e    *engine.Engine
	text string
	args []any
}

// decision is a statement's or a batch's decision, as runner.open makes it: begun on its
// connection, or before it has one (conn nil: the engine's BeginBeforeConn), and then told that
// the connection came, or that none could be had.
type decision interface {
	begin(ctx context.Context, conn *pgx.Conn) error
	acquired()
	abandon(ctx context.Context, err error)
}

func (t *ticket) begin(ctx context.Context, conn *pgx.Conn) error {
	if conn == nil {
		return t.e.BeginBeforeConn(ctx, &t.x, t.text, t.args)
	}
	return t.e.Begin(ctx, &t.x, explainOn(conn), t.text, t.args)
}

func (t *ticket) acquired()                              { t.x.Acquired() }
func (t *ticket) abandon(ctx context.Context, err error) { t.x.Abandon(ctx, err) }

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

// ticket returns a finished ticket, for open.
func (r *runner) ticket() *ticket { return r.tickets.Get().(*ticket) }

// end finishes t's statement with its outcome and takes the ticket back.
func (r *runner) end(ctx context.Context, t *ticket, err error) {
	t.x.Finish(ctx, err)
	r.tickets.Put(t)
}

// exec runs an Exec of sql at d, decided as text: sql itself, or the text of the statement sql
// names when sql is the name of a statement prepared in a transaction (see pgxTx.Prepare).
func (r *runner) exec(ctx context.Context, d dest, text, sql string, args []any) (_ pgconn.CommandTag, err error) {
	var o pgxOpen
	q, qctx, err := r.open(ctx, r.ticket(), &o, d, text, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	err = errPanicked // until q returns: a panic finishes the statement with it
	defer func() { o.end(err) }()
	var tag pgconn.CommandTag
	tag, err = q.Exec(qctx, r.outgoing(ctx, &o.t.x, text, sql), args...)
	err = overran(qctx, err)
	return tag, err
}

// open begins the statement text with args at d in t (see runner.ticket), kept in o, and returns
// where to send it and the context it runs under (overrunContext: its rows are read under it
// too). A statement that takes its connection from the pool gives it back once, when it ends
// (o.end). On nil the caller must end o on every path; on an error t is back, no connection is
// held and nothing may be sent.
func (r *runner) open(ctx context.Context, t *ticket, o *pgxOpen, d dest, text string, args []any) (
	q querier, qctx context.Context, err error) {
	t.text, t.args = text, args
	q, release, err := d.begin(ctx, t)
	t.text, t.args = "", nil // the engine keeps no reference, nor does the ticket
	if err != nil {
		r.tickets.Put(t)
		return nil, nil, blocked(err)
	}
	qctx, cancel := overrunContext(ctx, &t.x) // max_duration: cancelled on the server past it
	*o = pgxOpen{run: r, t: t, ctx: ctx, cancel: cancel, release: release}
	return q, qctx, nil
}

// begin makes dec's decision for a statement or batch at d, and returns where to send it and,
// when it took a connection from the pool, what gives it back. On a held connection it is
// decided there. A statement of the pool is decided before it takes a connection whenever the
// decision needs no EXPLAIN: so a refused statement takes no connection, and one waiting for
// capacity (max_wait) holds none; once admitted it keeps its slots while it waits for the pool,
// and if it gets no connection they go back at no cost. Only a statement whose cost needs an
// EXPLAIN on its connection takes the connection first, and gives it back at once if refused.
// On nil the decision must be finished.
func (d dest) begin(ctx context.Context, dec decision) (q querier, release releaser, err error) {
	if d.pool == nil {
		if q = d.q; q == nil {
			q = d.conn
		}
		return q, nil, dec.begin(ctx, d.conn)
	}
	err = dec.begin(ctx, nil)
	if err == engine.ErrNeedConn {
		var conn *pgx.Conn
		if q, conn, release, err = d.pool.acquire(ctx); err != nil {
			return nil, nil, err
		}
		if err = dec.begin(ctx, conn); err != nil {
			release.Release()
			return nil, nil, err
		}
		return q, release, nil
	}
	if err != nil {
		return nil, nil, err
	}
	acquired := false
	defer func() {
		if !acquired {
			dec.abandon(ctx, err) // no connection (or the pool's hook panicked): nothing ran
		}
	}()
	err = errPanicked
	if q, _, release, err = d.pool.acquire(ctx); err != nil {
		return nil, nil, err
	}
	acquired = true
	dec.acquired() // the wait for the pool is not the statement's cost
	return q, release, nil
}

// query runs a Query of sql at d, decided as text (see exec), with its rows in w (newPgxRows).
func (r *runner) query(ctx context.Context, d dest, text, sql string, args []any, w *pgxRows) (_ pgx.Rows, err error) {
	q, qctx, err := r.open(ctx, r.ticket(), w.open, d, text, args)
	if err != nil {
		return errRows{err: err}, err
	}
	w.Rows, w.qctx = nil, qctx
	err = errPanicked // until q returns
	defer func() {
		if err != nil {
			w.end(err)
		}
	}()
	var pr pgx.Rows
	pr, err = q.Query(qctx, r.outgoing(ctx, &w.open.t.x, text, sql), args...)
	if err != nil {
		err = overran(qctx, err)
		return errRows{err: err}, err
	}
	w.Rows = pr
	return w, nil
}

// queryRow runs a QueryRow of sql at d (see query) with pgx's own QueryRow, whose row's Scan
// ends the statement (pgxRow). The row comes from the ticket's slab (ticket.row).
func (r *runner) queryRow(ctx context.Context, d dest, text, sql string, args []any) pgx.Row {
	t := r.ticket()
	row := t.row()
	q, qctx, err := r.open(ctx, t, &row.open, d, text, args)
	if err != nil {
		row.err = err
		return row
	}
	row.qctx = qctx
	sent := false
	defer func() {
		if !sent {
			row.open.end(errPanicked) // pgx's QueryRow panicked
		}
	}()
	row.row = q.QueryRow(qctx, r.outgoing(ctx, &row.open.t.x, text, sql), args...)
	sent = true
	return row
}

// outgoing is the text to send for sql, decided as text in x: a prepared statement's name is
// sent as it is (a comment would make it another name).
func (r *runner) outgoing(ctx context.Context, x *engine.Exec, text, sql string) string {
	if text != sql {
		return sql
	}
	return r.c.intr.outgoing(ctx, x, sql)
}

// copyFrom runs a CopyFrom at d. The engine decides it as the statement COPY <table> FROM
// STDIN, which pg_query identifies as kind copy with its table: so it carries the built-in tags
// statement=copy and table=<name>, its cost is learned per table, until known it is reserved as
// any unknown cost is (EXPLAIN cannot cost a COPY), and it runs under its budgets' max_duration
// as any statement does.
func (r *runner) copyFrom(ctx context.Context, d dest, table pgx.Identifier, columns []string,
	src pgx.CopyFromSource) (_ int64, err error) {
	var o pgxOpen
	q, qctx, err := r.open(ctx, r.ticket(), &o, d, copyText(table), nil)
	if err != nil {
		return 0, err
	}
	err = errPanicked // until q returns
	defer func() { o.end(err) }()
	var n int64
	n, err = q.CopyFrom(qctx, table, columns, src)
	err = overran(qctx, err)
	return n, err
}

// copyText is the statement the engine decides for a CopyFrom into table.
func copyText(table pgx.Identifier) string { return "COPY " + table.Sanitize() + " FROM STDIN" }
