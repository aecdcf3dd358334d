package driver

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// RawConn calls f with the *pgx.Conn under c, for pgx-only features: CopyFrom, LISTEN/NOTIFY,
// SendBatch and so on. c must come from a pgtraffic *sql.DB. f must not retain the *pgx.Conn
// after it returns, nor close it. Statements sent through it bypass traffic control.
//
// database/sql's (*sql.Conn).Raw hands out the interceptor's connection, which hides pgx's;
// RawConn reaches it through a ping that the interceptor answers instead of sending.
//
//	conn, _ := db.Conn(ctx)
//	defer conn.Close()
//	err := driver.RawConn(ctx, conn, func(pc *pgx.Conn) error {
//		_, err := pc.CopyFrom(ctx, pgx.Identifier{"items"}, []string{"id"}, pgx.CopyFromRows(rows))
//		return err
//	})
func RawConn(ctx context.Context, c *sql.Conn, f func(*pgx.Conn) error) error {
	return c.Raw(func(dc any) error {
		p, ok := dc.(driver.Pinger)
		if !ok {
			return errors.New("pgtraffic: RawConn: not a pgtraffic connection")
		}
		req := &rawRequest{}
		if err := p.Ping(context.WithValue(ctx, rawRequestKey{}, req)); err != nil {
			return err
		}
		if req.conn == nil {
			return errors.New("pgtraffic: RawConn: not a pgtraffic connection")
		}
		return f(req.conn.Conn())
	})
}

type rawRequestKey struct{}

type rawRequest struct{ conn *stdlib.Conn }
