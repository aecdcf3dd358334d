package driver

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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

// runner puts the statements of a [Pool] and of its transactions through the
// engine: each is begun on the connection it will run on, sent through a querier, and finished
// when it completes. It keeps the engine's per-statement tickets for reuse (pgxpool has no
// per-connection state to keep one in). Safe for concurrent use.
type runner struct {
	c       *core
	tickets sync.Pool // *ticket, finished
	batches sync.Pool // *engine.Batch, finished
}

func newRunner(c *core) *runner {
	return &runner{c: c,
		tickets: sync.Pool{New: func() any { return new(ticket) }},
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

// ticket returns a finished ticket, for open.
func (r *runner) ticket() *ticket { return r.tickets.Get().(*ticket) }

// end finishes t's statement with its outcome and takes the ticket back.
func (r *runner) end(ctx context.Context, t *ticket, err error) {
	t.x.Finish(ctx, err)
	r.tickets.Put(t)
}

// exec runs an Exec of sql on q, whose connection is conn, decided as text: sql itself, or
// the text of the statement sql names when sql is the name of a statement prepared in a
// transaction (see pgxTx.Prepare).
func (r *runner) exec(ctx context.Context, q querier, conn *pgx.Conn, text, sql string, args []any) (_ pgconn.CommandTag, err error) {
	var o pgxOpen
	qctx, err := r.open(ctx, r.ticket(), &o, conn, text, args, nil)
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

// open begins the statement text with args, to be sent on conn (nil: no EXPLAIN), in t (see
// runner.ticket), kept in o, and returns the context it runs under (overrunContext: its rows
// are read under it too). release, if not nil, gives the connection back to the pool: once,
// when the statement ends (o.end), or now if it is refused. On nil the caller must end o on
// every path; on an error t is back and nothing may be sent.
func (r *runner) open(ctx context.Context, t *ticket, o *pgxOpen, conn *pgx.Conn, text string, args []any,
	release releaser) (qctx context.Context, err error) {
	if err := r.c.engine.Begin(ctx, &t.x, conn, text, args); err != nil {
		r.tickets.Put(t)
		if release != nil {
			release.Release()
		}
		return nil, blocked(err)
	}
	qctx, cancel := overrunContext(ctx, &t.x) // max_duration: cancelled on the server past it
	*o = pgxOpen{run: r, t: t, ctx: ctx, cancel: cancel, release: release}
	return qctx, nil
}

// query runs a Query of sql on q, whose connection is conn, decided as text (see exec), with
// its rows in w (newPgxRows). release, if not nil, gives the connection back to the pool (see
// open).
func (r *runner) query(ctx context.Context, q querier, conn *pgx.Conn, text, sql string, args []any,
	release releaser, w *pgxRows) (_ pgx.Rows, err error) {
	qctx, err := r.open(ctx, r.ticket(), w.open, conn, text, args, release)
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

// queryRow runs a QueryRow of sql on q (see query) with pgx's own QueryRow, whose row's Scan
// ends the statement (pgxRow). The row comes from the ticket's slab (ticket.row).
func (r *runner) queryRow(ctx context.Context, q querier, conn *pgx.Conn, text, sql string, args []any,
	release releaser) pgx.Row {
	t := r.ticket()
	row := t.row()
	qctx, err := r.open(ctx, t, &row.open, conn, text, args, release)
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

// copyFrom runs a CopyFrom on q, whose connection is conn. The engine decides it as the
// statement COPY <table> FROM STDIN, which pg_query identifies as kind copy with its table:
// so it carries the built-in tags statement=copy and table=<name>, its cost is learned per
// table, until known it is reserved as any unknown cost is (EXPLAIN cannot cost a COPY), and
// it runs under its budgets' max_duration as any statement does.
func (r *runner) copyFrom(ctx context.Context, q querier, conn *pgx.Conn, table pgx.Identifier, columns []string,
	src pgx.CopyFromSource) (_ int64, err error) {
	var o pgxOpen
	qctx, err := r.open(ctx, r.ticket(), &o, conn, copyText(table), nil, nil)
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
