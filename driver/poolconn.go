package driver

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PoolConn is a connection acquired from a [Pool] with [Pool.Acquire], [Pool.AcquireFunc] or
// [Pool.AcquireAllIdle]: its statements (Exec,
// Query, QueryRow, SendBatch, CopyFrom, and those of its transactions) are controlled as the
// pool's are, on this connection. Release it when done. Like pgxpool's connections it is used by
// one goroutine at a time. Conn is the *pgx.Conn underneath, for LISTEN/NOTIFY and other
// pgx-only features: statements sent through it bypass control.
type PoolConn struct {
	pc  *pgxpool.Conn
	run *runner
}

// Acquire takes a connection from the pool; release it with [PoolConn.Release].
func (p *Pool) Acquire(ctx context.Context) (*PoolConn, error) {
	pc, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, closedPool(err)
	}
	return &PoolConn{pc: pc, run: p.run}, nil
}

// AcquireFunc acquires a connection from the pool, calls f with it and releases it when f
// returns, on every path, a panic in f included; it returns f's error, or Acquire's. The
// statements f runs on the [*PoolConn] (Exec, Query, QueryRow, SendBatch, CopyFrom, and those
// of its transactions) are controlled as [Pool.Acquire]'s; those sent through its Conn bypass
// control. Acquiring is not decided. Close rows and batch results before f returns.
func (p *Pool) AcquireFunc(ctx context.Context, f func(*PoolConn) error) error {
	c, err := p.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	return f(c)
}

// AcquireAllIdle acquires, at once, every connection idle in the pool, as pgxpool's
// AcquireAllIdle does (for health checks and keep-alives; it does not update the pool's
// acquire statistics), and returns them as [*PoolConn]s whose statements are controlled as
// [Pool.Acquire]'s; those sent through their Conn bypass control. Acquiring is not decided, and
// a ping or keep-alive sent as a statement is decided as any other. Release each one.
func (p *Pool) AcquireAllIdle(ctx context.Context) []*PoolConn {
	pcs := p.pool.AcquireAllIdle(ctx)
	conns := make([]*PoolConn, len(pcs))
	for i, pc := range pcs {
		conns[i] = &PoolConn{pc: pc, run: p.run}
	}
	return conns
}

func (c *PoolConn) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return c.run.exec(ctx, c.dest(), sql, args)
}

func (c *PoolConn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return c.run.query(ctx, c.dest(), sql, args)
}

func (c *PoolConn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return c.run.queryRow(ctx, c.dest(), sql, args)
}

func (c *PoolConn) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return c.run.sendBatch(ctx, c.dest(), b)
}

func (c *PoolConn) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return c.run.copyFrom(ctx, c.dest(), table, columns, src)
}

// dest is where the connection's statements run: on it, with the names prepared on the pool's
// connections.
func (c *PoolConn) dest() *dest { return &dest{conn: c.pc.Conn(), names: &c.run.names} }

// Begin starts a transaction on the connection, controlled as [Pool.BeginTx]'s.
func (c *PoolConn) Begin(ctx context.Context) (pgx.Tx, error) {
	return c.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx starts a transaction with o on the connection, controlled as [Pool.BeginTx]'s.
func (c *PoolConn) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	t, err := c.pc.BeginTx(ctx, o)
	if err != nil {
		return nil, err
	}
	return &pgxTx{Tx: t, run: c.run, prepared: map[string]string{}}, nil
}

// Ping pings the server on the connection; it is not decided.
func (c *PoolConn) Ping(ctx context.Context) error { return c.pc.Ping(ctx) }

// Release returns the connection to the pool. Close its rows and batch results first.
func (c *PoolConn) Release() { c.pc.Release() }

// Conn returns the *pgx.Conn underneath. Statements sent through it bypass traffic control.
func (c *PoolConn) Conn() *pgx.Conn { return c.pc.Conn() }

// Hijack takes the connection out of the pool for good, as pgxpool's does (a long-lived LISTEN,
// say): the caller owns the *pgx.Conn and closes it. Statements sent through it bypass traffic
// control, and the pool may open another connection in its place.
func (c *PoolConn) Hijack() *pgx.Conn { return c.pc.Hijack() }
