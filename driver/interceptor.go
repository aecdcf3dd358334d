package driver

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"reflect"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/ngrok/sqlmw"

	"github.com/pgtraffic/pgtraffic/internal/engine"
)

// interceptor is the sqlmw.Interceptor that puts every statement through the engine: Exec and
// Query on a connection (inside or outside a transaction, via *sql.DB, *sql.Tx or *sql.Conn) and
// Exec and Query of prepared statements.
type interceptor struct {
	sqlmw.NullInterceptor
	engine    *engine.Engine
	commenter bool
}

var _ sqlmw.Interceptor = (*interceptor)(nil)

// blocked converts the engine's denial into the public error.
func blocked(err error) error {
	var d *engine.Denial
	if errors.As(err, &d) {
		return &BlockedError{Budget: d.Budget, Rule: d.Rule, Reason: d.Reason, Fingerprint: d.Fingerprint,
			RetryAfter: d.RetryAfter, Limit: d.Limit}
	}
	return err
}

func (i *interceptor) ConnExecContext(ctx context.Context, conn driver.ExecerContext, query string, args []driver.NamedValue) (driver.Result, error) {
	x, err := i.engine.Begin(ctx, pgxConnOf(conn), query, args)
	if err != nil {
		return nil, blocked(err)
	}
	res, err := conn.ExecContext(ctx, i.outgoing(ctx, x, query), args)
	x.Finish(ctx, err)
	return res, err
}

func (i *interceptor) ConnQueryContext(ctx context.Context, conn driver.QueryerContext, query string, args []driver.NamedValue) (context.Context, driver.Rows, error) {
	x, err := i.engine.Begin(ctx, pgxConnOf(conn), query, args)
	if err != nil {
		return ctx, nil, blocked(err)
	}
	rows, err := conn.QueryContext(ctx, i.outgoing(ctx, x, query), args)
	if err != nil {
		x.Finish(ctx, err)
		return ctx, nil, err
	}
	return &rowsContext{Context: ctx, x: x}, rows, nil
}

func (i *interceptor) ConnPrepareContext(ctx context.Context, conn driver.ConnPrepareContext, query string) (context.Context, driver.Stmt, error) {
	s, err := conn.PrepareContext(ctx, query)
	if err != nil {
		return ctx, nil, err
	}
	// Keep the connection with the statement: EXPLAIN must run on the connection that will run it.
	return ctx, &stmt{Stmt: s, conn: pgxConnOf(conn)}, nil
}

func (i *interceptor) StmtExecContext(ctx context.Context, st driver.StmtExecContext, query string, args []driver.NamedValue) (driver.Result, error) {
	x, err := i.engine.Begin(ctx, stmtConnOf(st), query, args)
	if err != nil {
		return nil, blocked(err)
	}
	res, err := st.ExecContext(ctx, args)
	x.Finish(ctx, err)
	return res, err
}

func (i *interceptor) StmtQueryContext(ctx context.Context, st driver.StmtQueryContext, query string, args []driver.NamedValue) (context.Context, driver.Rows, error) {
	x, err := i.engine.Begin(ctx, stmtConnOf(st), query, args)
	if err != nil {
		return ctx, nil, blocked(err)
	}
	rows, err := st.QueryContext(ctx, args)
	if err != nil {
		x.Finish(ctx, err)
		return ctx, nil, err
	}
	return &rowsContext{Context: ctx, x: x}, rows, nil
}

// RowsNext finishes the statement when the rows are exhausted or fail.
func (i *interceptor) RowsNext(ctx context.Context, rows driver.Rows, dest []driver.Value) error {
	err := rows.Next(dest)
	if err != nil {
		if rc, ok := ctx.(*rowsContext); ok {
			if err == io.EOF {
				rc.finish(nil)
			} else {
				rc.finish(err)
			}
		}
	}
	return err
}

// RowsClose finishes the statement if the rows were closed before they were exhausted.
func (i *interceptor) RowsClose(ctx context.Context, rows driver.Rows) error {
	err := rows.Close()
	if rc, ok := ctx.(*rowsContext); ok {
		rc.finish(err)
	}
	return err
}

// ConnPing serves RawConn: a ping carrying a rawRequest hands back the pgx connection instead
// of pinging. sqlmw passes ConnPing the connection itself, unlike every other hook.
func (i *interceptor) ConnPing(ctx context.Context, conn driver.Pinger) error {
	if req, ok := ctx.Value(rawRequestKey{}).(*rawRequest); ok {
		req.conn, _ = conn.(*stdlib.Conn)
		return nil
	}
	return conn.Ping(ctx)
}

// rowsContext carries a query's Exec from the Query hook to the Rows hooks (sqlmw hands the
// context returned by the Query hook to them). Finishing is idempotent: database/sql calls Close
// after Next has reported the end.
type rowsContext struct {
	context.Context
	x *engine.Exec
}

func (rc *rowsContext) finish(err error) {
	if rc.x != nil {
		x := rc.x
		rc.x = nil
		x.Finish(rc.Context, err)
	}
}

// stmt is a prepared statement that remembers its connection.
type stmt struct {
	driver.Stmt
	conn *stdlib.Conn
}

var (
	_ driver.StmtExecContext  = (*stmt)(nil)
	_ driver.StmtQueryContext = (*stmt)(nil)
)

func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if ec, ok := s.Stmt.(driver.StmtExecContext); ok {
		return ec.ExecContext(ctx, args)
	}
	vals, err := values(ctx, args)
	if err != nil {
		return nil, err
	}
	return s.Stmt.Exec(vals) //nolint:staticcheck // the parent has no context-aware Exec
}

func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if qc, ok := s.Stmt.(driver.StmtQueryContext); ok {
		return qc.QueryContext(ctx, args)
	}
	vals, err := values(ctx, args)
	if err != nil {
		return nil, err
	}
	return s.Stmt.Query(vals) //nolint:staticcheck // the parent has no context-aware Query
}

// values converts named arguments for a statement without context support (pgx's has it).
func values(ctx context.Context, args []driver.NamedValue) ([]driver.Value, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	vals := make([]driver.Value, len(args))
	for i, a := range args {
		if a.Name != "" {
			return nil, errors.New("pgtraffic: named arguments need a driver with context support")
		}
		vals[i] = a.Value
	}
	return vals, nil
}

// pgxConnOf returns the pgx stdlib connection inside sqlmw's parent-connection wrapper, or nil.
//
// sqlmw hands the hooks its wrappedParentConn, a struct with one exported embedded field (the
// driver.Conn it wraps) and no accessor. Reading that field with reflect is the one way to reach
// the connection without forking sqlmw; TestSQLMWLayout fails if sqlmw changes the layout, and
// a nil result only disables EXPLAIN (cost falls back to history), never a statement.
func pgxConnOf(v any) *stdlib.Conn {
	if c, ok := unwrapOne(v).(*stdlib.Conn); ok {
		return c
	}
	return nil
}

func stmtConnOf(v any) *stdlib.Conn {
	if s, ok := unwrapOne(v).(*stmt); ok {
		return s.conn
	}
	return nil
}

func unwrapOne(v any) any {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Struct || rv.NumField() != 1 {
		return v
	}
	f := rv.Field(0)
	if f.Kind() != reflect.Interface || !f.CanInterface() || f.IsNil() {
		return v
	}
	return f.Interface()
}
