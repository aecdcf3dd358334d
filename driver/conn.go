package driver

import (
	"context"
	"database/sql/driver"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgtraffic/pgtraffic/internal/engine"
)

// interceptor holds what every connection of a connector shares: the engine that decides each
// statement and the sqlcommenter-out switch.
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

	// spare is the connection's rows wrapper, reused so that a query does not allocate one; nil
	// while it is handed out (or before the first query). A second query while one is open
	// (possible in a transaction) gets a new wrapper. While handed out only the *sql.Rows holds
	// it, so that rows leaked unclosed can be garbage-collected and their slots reclaimed (see
	// leak.go). Used only under database/sql's lock of the connection, which it holds for
	// QueryContext and for Rows.Close.
	spare     *rows
	spareMade bool // the spare exists (it may be handed out)

	// exec is the statement of ExecContext (the connection's or a prepared statement's), which
	// finishes before the call returns; a query's statement lives in its rows wrapper instead.
	exec engine.Exec
	// args holds a statement's argument values while the engine decides it (see beginExec), reused
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
	return &conn{parent: pc, pgx: px, intr: intr, valid: v}, nil
}

// blocked converts the engine's denial into the public error. Never driver.ErrBadConn: a
// blocked statement must not be retried on another connection.
func blocked(err error) error {
	var d *engine.Denial
	if errors.As(err, &d) {
		return &BlockedError{Budget: d.Budget, Rule: d.Rule, Reason: d.Reason, Fingerprint: d.Fingerprint,
			RetryAfter: d.RetryAfter, Limit: d.Limit}
	}
	return err
}

// errPanicked is the outcome a statement is finished with when the call that ran it panicked: not
// a success, so the cost model does not learn from it.
var errPanicked = errors.New("pgtraffic: the statement's call panicked")

// beginExec begins x, the statement query with args, in the engine. On nil the caller must
// finish x, on every path (defer).
func (c *conn) beginExec(ctx context.Context, x *engine.Exec, query string, args []driver.NamedValue) error {
	// database/sql passes values in order; their names are not used (pgx sends arguments
	// positionally, and so does the engine's EXPLAIN).
	vals := c.args[:0]
	for i := range args {
		vals = append(vals, args[i].Value)
	}
	c.args = vals
	err := c.intr.engine.Begin(ctx, x, explainOn(c.pgx), query, vals)
	clear(vals) // the engine keeps no reference: let the values go until the next statement
	if err != nil {
		return blocked(err)
	}
	return nil
}

func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (_ driver.Result, err error) {
	x := &c.exec
	if err := c.beginExec(ctx, x, query, args); err != nil {
		return nil, err
	}
	qctx, cancel := overrunContext(ctx, x)
	if cancel != nil {
		defer cancel()
	}
	err = errPanicked // until the parent returns: a panic finishes the statement with it
	defer func() { x.Finish(ctx, err) }()
	var res driver.Result
	res, err = c.parent.ExecContext(qctx, c.intr.outgoing(ctx, x, query), args)
	return res, overran(qctx, err)
}

func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (_ driver.Rows, err error) {
	w, err := c.begin(ctx, query, args)
	if err != nil {
		return nil, err
	}
	err = errPanicked // until the parent returns
	defer func() { c.settle(w, err) }()
	var r driver.Rows
	r, err = c.parent.QueryContext(w.open.qctx, c.intr.outgoing(ctx, &w.open.x, query), args)
	return c.opened(w, r, err)
}

// begin begins a query's statement in a rows wrapper: the connection's spare when it is free.
// On nil the caller must settle it (defer).
func (c *conn) begin(ctx context.Context, query string, args []driver.NamedValue) (*rows, error) {
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
	if err := c.beginExec(ctx, &w.open.x, query, args); err != nil {
		w.handBack()
		return nil, err
	}
	w.open.ctx = ctx
	w.open.qctx, w.open.cancel = overrunContext(ctx, &w.open.x)
	return w, nil
}

// settle ends the call that ran a query begun in w. err is its outcome: nil when w was handed
// out with the parent's rows (their Close finishes the statement), else the parent's error or
// errPanicked, and then the statement is finished and w handed back.
func (c *conn) settle(w *rows, err error) {
	if err != nil {
		w.open.finish(err)
		w.handBack()
	}
}

// opened returns w wrapping r, the parent's answer to the query begun in w; if the parent
// failed, nil and its error, for settle.
func (c *conn) opened(w *rows, r driver.Rows, err error) (driver.Rows, error) {
	if err != nil {
		return nil, overran(w.open.qctx, err)
	}
	w.Rows = r
	return w, nil
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

// BeginTx, Commit and Rollback need no decision: pgx's transaction is returned as it is.
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
