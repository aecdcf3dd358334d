package driver

import (
	"context"
	"database/sql/driver"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgtraffic/pgtraffic/internal/engine"
)

// interceptor holds what every statement of a front end shares (a connector's connections, a
// pool's statements): the engine that decides each statement, the sqlcommenter-out switch and
// the leak reports. Its run (run.go) runs each statement.
type interceptor struct {
	engine    *engine.Engine
	commenter bool
	leaks     *leaks // reclaimed statements of rows never closed (see leak.go)
}

// parentConn is what pgtraffic needs of the connection it wraps: pgx's *stdlib.Conn in
// production, a fake in unit tests.
type parentConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.NamedValueChecker
}

// conn is a connection that puts every statement through the engine before pgx sends it: Exec
// and Query on the connection (inside or outside a transaction, via *sql.DB, *sql.Tx or
// *sql.Conn) and, through stmt, prepared statements. Like every driver.Conn it is used by one
// goroutine at a time (database/sql holds its lock).
type conn struct {
	parent parentConn
	pgx    *pgx.Conn // the pgx connection under parent, for EXPLAIN; nil in unit tests
	intr   *interceptor
	valid  driver.Validator // parent's, if it has one (pgx's has not), found once
	// dest is where the connection's statements run: on it, retried by database/sql on another
	// when it closed while the engine held them back (badConn).
	dest dest

	// spare is the connection's rows wrapper, reused so that a query does not allocate one; nil
	// while it is handed out (or before the first query). A second query while one is open
	// (possible in a transaction) gets a new wrapper. While handed out only the *sql.Rows holds
	// it, so that rows leaked unclosed can be garbage-collected and their slots reclaimed (see
	// leak.go). Used only under database/sql's lock of the connection, which it holds for
	// QueryContext and for Rows.Close.
	spare     *rows
	spareMade bool // the spare exists (it may be handed out)

	// ticket is the ticket of ExecContext's statement (the connection's or a prepared
	// statement's), which finishes before the call returns; a query's lives with its rows
	// wrapper instead.
	ticket ticket
	// args holds a statement's argument values while the engine decides it (see values), reused
	// from one statement to the next.
	args []any
}

var (
	_ driver.Conn               = (*conn)(nil)
	_ driver.ConnBeginTx        = (*conn)(nil)
	_ driver.ConnPrepareContext = (*conn)(nil)
	_ driver.ExecerContext      = (*conn)(nil)
	_ driver.QueryerContext     = (*conn)(nil)
	_ driver.Pinger             = (*conn)(nil)
	_ driver.SessionResetter    = (*conn)(nil)
	_ driver.NamedValueChecker  = (*conn)(nil)
	_ driver.Validator          = (*conn)(nil)
)

func newConn(parent driver.Conn, intr *interceptor) (*conn, error) {
	pc, ok := parent.(parentConn)
	if !ok {
		parent.Close()
		return nil, errors.New("pgtraffic: the pgx connection lacks a context-aware driver interface")
	}
	var px *pgx.Conn
	if sc, ok := parent.(*stdlib.Conn); ok {
		px = sc.Conn()
	}
	v, _ := parent.(driver.Validator)
	return &conn{parent: pc, pgx: px, intr: intr, valid: v, dest: dest{conn: px, retry: true}}, nil
}

// values returns the values of args, in c.args: database/sql passes them in order, and their
// names are not used (pgx sends arguments positionally, and so does the engine's EXPLAIN).
// The caller clears them once the statement has run, so that the connection does not keep
// them until its next statement.
func (c *conn) values(args []driver.NamedValue) []any {
	vals := c.args[:0]
	for i := range args {
		vals = append(vals, args[i].Value)
	}
	c.args = vals
	return vals
}

func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return c.exec(ctx, query, args, nil)
}

// exec runs an Exec of query: the connection's own (prepared nil), or prepared's, a statement
// prepared from query on this connection.
func (c *conn) exec(ctx context.Context, query string, args []driver.NamedValue, prepared driver.Stmt) (
	res driver.Result, err error) {
	t := c.ticket.statement(ctx, query, c.values(args))
	o := openStmt{j: t}
	err = c.intr.run(ctx, &o, &c.dest, false, func(_ querier, qctx context.Context) (err error) {
		if prepared == nil {
			res, err = c.parent.ExecContext(qctx, c.intr.outgoing(&o, t, query, false), args)
			return err
		}
		ec, ok := prepared.(driver.StmtExecContext)
		if !ok {
			return errNoContext
		}
		res, err = ec.ExecContext(qctx, args)
		return err
	})
	clear(c.args) // the engine keeps no reference: let the values go until the next statement
	return res, err
}

func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.query(ctx, query, args, nil)
}

// query runs a Query of query (see exec) with its rows in a wrapper: the connection's spare when
// it is free. The rows finish the statement when they end.
func (c *conn) query(ctx context.Context, query string, args []driver.NamedValue, prepared driver.Stmt) (
	driver.Rows, error) {
	w := c.wrapper()
	defer w.free()
	t := w.own.statement(ctx, query, c.values(args))
	w.open.j = t
	err := c.intr.run(ctx, w.open, &c.dest, true, func(_ querier, qctx context.Context) (err error) {
		if prepared == nil {
			w.Rows, err = c.parent.QueryContext(qctx, c.intr.outgoing(w.open, t, query, false), args)
			return err
		}
		qc, ok := prepared.(driver.StmtQueryContext)
		if !ok {
			return errNoContext
		}
		w.Rows, err = qc.QueryContext(qctx, args)
		return err
	})
	clear(c.args)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// wrapper returns a rows wrapper for a query: the connection's spare when it is
// free. One whose statement does not open is free again (rows.free).
func (c *conn) wrapper() *rows {
	var w *rows
	switch {
	case c.spare != nil:
		w, c.spare = c.spare, nil
	case !c.spareMade: // the first query: make the spare
		w, c.spareMade = newRows(c.intr.leaks), true
		w.owner = c
	default: // the spare is handed out
		w = newRows(c.intr.leaks)
	}
	return w
}

// PrepareContext prepares on the server (no statement runs, so nothing is decided yet); each
// execution of the statement is decided like any other.
func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	s, err := c.parent.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &stmt{parent: s, conn: c, query: query}, nil
}

func (c *conn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// BeginTx, Commit and Rollback need no decision: pgx's transaction is returned as it is. (The
// engine decides none of a transaction's own statements sent as text either:
// pattern.Pattern.Transaction.)
func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.parent.BeginTx(ctx, opts)
}

// Begin is the pre-context form, which database/sql no longer calls.
func (c *conn) Begin() (driver.Tx, error) {
	return c.parent.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *conn) Close() error                               { return c.parent.Close() }
func (c *conn) Ping(ctx context.Context) error             { return c.parent.Ping(ctx) }
func (c *conn) ResetSession(ctx context.Context) error     { return c.parent.ResetSession(ctx) }
func (c *conn) CheckNamedValue(v *driver.NamedValue) error { return c.parent.CheckNamedValue(v) }

// IsValid tells database/sql, when a connection is returned to its pool, whether to keep it.
// pgx closes a connection whose statement was interrupted by its context; without this check
// the pool would keep it, and a later statement could meet only such connections and fail with
// driver.ErrBadConn after database/sql's retries (seen with a pool smaller than its users).
func (c *conn) IsValid() bool {
	if c.valid != nil {
		return c.valid.IsValid()
	}
	if c.pgx != nil {
		return !c.pgx.IsClosed()
	}
	return true
}
