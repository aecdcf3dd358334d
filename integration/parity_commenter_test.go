package integration

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestCommenterLeavesNamesPreparedOnConn: WithSQLCommenter's documentation promises "prepared
// statements are not rewritten", and pgx runs a statement by the name it was prepared under
// (Conn.Prepare) when that name is passed as the SQL. With the commenter on, a statement
// prepared through a PoolConn's Conn (the pgx-only feature PoolConn.Conn is offered for) and run
// by its name through the PoolConn, its transaction or a batch runs, as on a plain
// pgxpool.Pool: a comment appended to the name ("onconn /*app='web'*/") would make pgx send it
// as SQL, a syntax error.
func TestCommenterLeavesNamesPreparedOnConn(t *testing.T) {
	srv := pgtest.Shared(t)
	ctx := tagging.With(context.Background(), "app", "web")

	run := func(t *testing.T, acquire func() (interface {
		QueryRow(context.Context, string, ...any) pgx.Row
		Begin(context.Context) (pgx.Tx, error)
		SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
		Conn() *pgx.Conn
		Release()
	}, error)) map[string]string {
		c, err := acquire()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		if _, err := c.Conn().Prepare(ctx, "onconn", "select 41 + 1"); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		var n int
		got["conn QueryRow"] = parityErr(c.QueryRow(ctx, "onconn").Scan(&n))
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got["tx QueryRow"] = parityErr(tx.QueryRow(ctx, "onconn").Scan(&n))
		_ = tx.Rollback(ctx)
		b := &pgx.Batch{}
		b.Queue("onconn")
		br := c.SendBatch(ctx, b)
		got["batch QueryRow"] = parityErr(br.QueryRow().Scan(&n))
		_ = br.Close()
		return got
	}

	rawDSN := srv.CreateDatabase(t)
	raw, err := pgxpool.New(context.Background(), rawDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	type acq = interface {
		QueryRow(context.Context, string, ...any) pgx.Row
		Begin(context.Context) (pgx.Tx, error)
		SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
		Conn() *pgx.Conn
		Release()
	}
	want := run(t, func() (acq, error) { return raw.Acquire(ctx) })

	p, err := driver.NewPool(context.Background(), srv.CreateDatabase(t), driver.WithSQLCommenter(true))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got := run(t, func() (acq, error) { return p.Acquire(ctx) })
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s by the name of a statement prepared on the connection's Conn: pgxpool %s, pgtraffic with WithSQLCommenter(true) %s", k, w, got[k])
		}
	}
}
