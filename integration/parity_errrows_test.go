package integration

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// TestFailedQueryRowsKeepTheirConn: on a pgxpool.Conn (and in a transaction) a Query
// that fails returns pgx's own rows, whose Conn() and TypeMap() are the connection's, as for
// any pgx.Conn.Query. So on a driver.PoolConn (and in a driver.Pool transaction), with no
// rules at all: code that reads rows.Conn() or rows.TypeMap() after a failed query (a logger, a
// helper decoding with the connection's type map) must not find nil where pgxpool has none.
func TestFailedQueryRowsKeepTheirConn(t *testing.T) {
	srv := pgtest.Shared(t)
	ctx := context.Background()
	type conn interface {
		Query(context.Context, string, ...any) (pgx.Rows, error)
		Begin(context.Context) (pgx.Tx, error)
		Release()
	}
	probe := func(c conn) (connOK, typeMapOK, txConnOK, txTypeMapOK bool) {
		defer c.Release()
		rows, err := c.Query(ctx, "select * from no_such_table")
		if err == nil {
			t.Fatal("no error")
		}
		connOK, typeMapOK = rows.Conn() != nil, rows.TypeMap() != nil
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		rows, err = tx.Query(ctx, "select * from no_such_table")
		if err == nil {
			t.Fatal("no error")
		}
		return connOK, typeMapOK, rows.Conn() != nil, rows.TypeMap() != nil
	}
	raw, err := pgxpool.New(ctx, srv.CreateDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	rc, err := raw.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w1, w2, w3, w4 := probe(rc)

	p, err := driver.NewPool(ctx, srv.CreateDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	pc, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g1, g2, g3, g4 := probe(pc)
	if w1 != g1 || w2 != g2 || w3 != g3 || w4 != g4 {
		t.Errorf("failed Query's rows: Conn()!=nil, TypeMap()!=nil on the connection, then in a transaction:\n  pgxpool:   %v %v %v %v\n  pgtraffic: %v %v %v %v",
			w1, w2, w3, w4, g1, g2, g3, g4)
	}
}
