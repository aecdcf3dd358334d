package driver

import (
	"context"
	"database/sql/driver"
	"errors"
)

// stmt is a prepared statement; each execution goes through the engine on the statement's
// connection (EXPLAIN must run where the statement will).
type stmt struct {
	parent driver.Stmt
	conn   *conn
	query  string
}

var (
	_ driver.Stmt             = (*stmt)(nil)
	_ driver.StmtExecContext  = (*stmt)(nil)
	_ driver.StmtQueryContext = (*stmt)(nil)
)

func (s *stmt) Close() error  { return s.parent.Close() }
func (s *stmt) NumInput() int { return s.parent.NumInput() }

func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (_ driver.Result, err error) {
	x := &s.conn.exec
	if err := s.conn.beginExec(ctx, x, s.query, args); err != nil {
		return nil, err
	}
	qctx, cancel := overrunContext(ctx, x)
	if cancel != nil {
		defer cancel()
	}
	err = errPanicked // until the parent returns: a panic finishes the statement with it
	defer func() { x.Finish(ctx, err) }()
	ec, ok := s.parent.(driver.StmtExecContext)
	if !ok {
		return nil, errNoContext
	}
	var res driver.Result
	res, err = ec.ExecContext(qctx, args)
	return res, overran(qctx, err)
}

func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (_ driver.Rows, err error) {
	w, err := s.conn.begin(ctx, s.query, args)
	if err != nil {
		return nil, err
	}
	err = errPanicked // until the parent returns
	defer func() { s.conn.settle(w, err) }()
	qc, ok := s.parent.(driver.StmtQueryContext)
	if !ok {
		return nil, errNoContext
	}
	var r driver.Rows
	r, err = qc.QueryContext(w.open.qctx, args)
	return s.conn.opened(w, r, err)
}

var errNoContext = errors.New("pgtraffic: the prepared statement lacks context-aware Exec/Query")

// Exec and Query are the pre-context forms, which database/sql no longer calls (pgx does not
// implement them either).
func (s *stmt) Exec([]driver.Value) (driver.Result, error) {
	return nil, errors.New("pgtraffic: Stmt.Exec is deprecated: use ExecContext")
}

func (s *stmt) Query([]driver.Value) (driver.Rows, error) {
	return nil, errors.New("pgtraffic: Stmt.Query is deprecated: use QueryContext")
}
