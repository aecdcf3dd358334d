package driver

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
)

// RawConn calls f with the *pgx.Conn under c, for pgx-only features: CopyFrom, LISTEN/NOTIFY,
// SendBatch and so on. c must come from a pgtraffic *sql.DB. f must not retain the *pgx.Conn
// after it returns, nor close it. Statements sent through it bypass traffic control.
//
//	conn, _ := db.Conn(ctx)
//	defer conn.Close()
//	err := driver.RawConn(ctx, conn, func(pc *pgx.Conn) error {
//		_, err := pc.CopyFrom(ctx, pgx.Identifier{"items"}, []string{"id"}, pgx.CopyFromRows(rows))
//		return err
//	})
//
// (*sql.Conn).Raw works too. The value it hands out is pgtraffic's connection, not pgx's
// *stdlib.Conn, so pgx's idiom dc.(*stdlib.Conn).Conn() panics; but it has the same Conn method,
// and asserting that method works under both drivers:
//
//	err := conn.Raw(func(dc any) error {
//		pc := dc.(interface{ Conn() *pgx.Conn }).Conn()
//		...
//	})
func RawConn(ctx context.Context, c *sql.Conn, f func(*pgx.Conn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return c.Raw(func(dc any) error {
		pc, ok := dc.(*conn)
		if !ok || pc.pgx == nil {
			return errors.New("pgtraffic: RawConn: not a pgtraffic connection")
		}
		return f(pc.pgx)
	})
}

// pgxConner is the method that the connection (*sql.Conn).Raw hands out shares with pgx's
// *stdlib.Conn (see [RawConn]).
type pgxConner interface{ Conn() *pgx.Conn }

var _ pgxConner = (*conn)(nil)

// Conn returns the *pgx.Conn under the connection, as pgx's (*stdlib.Conn).Conn does, for
// (*sql.Conn).Raw callers (see [RawConn]).
func (c *conn) Conn() *pgx.Conn {
	return c.pgx // nil under a fake parent (unit tests)
}
