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
	return s.conn.exec(ctx, s.query, args, s.parent)
}

func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return s.conn.query(ctx, s.query, args, s.parent)
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
