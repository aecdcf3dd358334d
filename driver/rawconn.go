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
// ((*sql.Conn).Raw hands out pgtraffic's connection, which hides pgx's; RawConn unwraps it.)
func RawConn(ctx context.Context, c *sql.Conn, f func(*pgx.Conn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return c.Raw(func(dc any) error {
		pc, ok := dc.(*conn)
		if !ok || pc.pgx == nil {
			return errors.New("pgtraffic: RawConn: not a pgtraffic connection")
		}
		return f(pc.pgx.Conn())
	})
}
