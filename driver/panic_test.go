package driver

import (
	"context"
	"database/sql/driver"
	"fmt"
	"testing"
)

// panicConn is a fakeConn whose pgx side panics at the point named by at: "exec", "query" (the
// connection's or a prepared statement's, "stmt exec", "stmt query") or "rows close".
type panicConn struct {
	fakeConn
	at string
}

func (c *panicConn) maybe(point string) {
	if c.at == point {
		panic("pgx panics in " + point)
	}
}

func (c *panicConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	c.maybe("exec")
	return c.fakeConn.ExecContext(ctx, q, args)
}

func (c *panicConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	c.maybe("query")
	return &panicRows{fakeRows: fakeRows{n: 2}, c: c}, nil
}

func (c *panicConn) PrepareContext(context.Context, string) (driver.Stmt, error) {
	return &panicStmt{fakeStmt: fakeStmt{c: &c.fakeConn}, pc: c}, nil
}

type panicStmt struct {
	fakeStmt
	pc *panicConn
}

func (s *panicStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.pc.maybe("stmt exec")
	return s.fakeStmt.ExecContext(ctx, args)
}

func (s *panicStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.pc.maybe("stmt query")
	return &panicRows{fakeRows: fakeRows{n: 1}, c: s.pc}, nil
}

type panicRows struct {
	fakeRows
	c *panicConn
}

func (r *panicRows) Close() error {
	r.c.maybe("rows close")
	return nil
}

// TestPanicReleasesHolds: a panic on the pgx side of a statement (in its exec, its query, a
// prepared statement's, or the rows' Close), recovered by the caller, leaves the statement's
// budget slot released: the budget's in-flight count is 0 and the next statement is admitted.
func TestPanicReleasesHolds(t *testing.T) {
	for _, at := range []string{"exec", "query", "stmt exec", "stmt query", "rows close"} {
		t.Run(at, func(t *testing.T) {
			pc := &panicConn{at: at}
			c, db := fakeDB(t, `
budgets:
  - {name: one, mode: enforce, max_concurrent: 1}
rules:
  - {budget: one, match: {statement: select}}
`, pc)
			ctx := context.Background()
			const q = "select x from t where id = $1"
			recovered := func() (r any) {
				defer func() { r = recover() }()
				switch at {
				case "exec":
					_, err := db.ExecContext(ctx, q, 1)
					return err
				case "query", "rows close":
					rows, err := db.QueryContext(ctx, q, 1)
					if err != nil {
						return err
					}
					return rows.Close()
				case "stmt exec", "stmt query":
					st, err := db.PrepareContext(ctx, q)
					if err != nil {
						return err
					}
					defer st.Close()
					if at == "stmt exec" {
						_, err = st.ExecContext(ctx, 1)
						return err
					}
					rows, err := st.QueryContext(ctx, 1)
					if err != nil {
						return err
					}
					return rows.Close()
				}
				return nil
			}()
			if want := "pgx panics in " + at; fmt.Sprint(recovered) != want {
				t.Fatalf("recovered %v, want the pgx panic", recovered)
			}
			if got := c.Snapshot().Budgets[0].InFlight; got != 0 {
				t.Fatalf("budget in flight %d after a panic in %s, want 0", got, at)
			}
			pc.at = ""
			if _, err := db.ExecContext(ctx, q, 2); err != nil {
				t.Fatalf("next statement after a panic in %s: %v", at, err)
			}
		})
	}
}
