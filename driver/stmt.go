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

func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	x := &s.conn.exec
	if err := s.conn.intr.engine.Begin(ctx, x, s.conn.pgx, s.query, args); err != nil {
		return nil, blocked(err)
	}
	var res driver.Result
	var err error
	if ec, ok := s.parent.(driver.StmtExecContext); ok {
		res, err = ec.ExecContext(ctx, args)
	} else {
		err = errNoContext
	}
	x.Finish(ctx, err)
	return res, err
}

func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	w, err := s.conn.begin(ctx, s.query, args)
	if err != nil {
		return nil, err
	}
	qc, ok := s.parent.(driver.StmtQueryContext)
	if !ok {
		return s.conn.opened(w, nil, errNoContext)
	}
	r, err := qc.QueryContext(ctx, args)
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
