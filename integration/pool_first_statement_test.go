package integration

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// TestPoolFirstStatementAcquiresOnce: a new Pool whose pgxpool.Config has an AfterConnect hook
// (which prepares statements) takes one connection for its first statement, as pgxpool does:
// its PrepareConn hook runs once, and no second connection is dialled. The Pool took a
// connection first to learn the hook's names (a statement run by a name is decided as its
// text), then its statement took another, and with an AfterRelease hook, which pgxpool runs
// after the first was given back, often dialled a second. A statement run by a name prepared
// there is still decided as its text: a DELETE without WHERE is refused by the guard.
func TestPoolFirstStatementAcquiresOnce(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	ctx := context.Background()
	setup, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Exec(ctx, "create table scratch (id int)"); err != nil {
		t.Fatal(err)
	}
	setup.Close(ctx)
	cfg, err := driver.ParseConfig([]byte("guards: {require_where: enforce}\n"))
	if err != nil {
		t.Fatal(err)
	}
	type hooks struct{ connects, prepares atomic.Int64 }
	config := func(h *hooks) *pgxpool.Config {
		c, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		c.MaxConns = 3
		c.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			h.connects.Add(1)
			_, err := conn.Prepare(ctx, "purge", "delete from scratch")
			return err
		}
		c.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) { h.prepares.Add(1); return true, nil }
		c.AfterRelease = func(*pgx.Conn) bool { return true }
		return c
	}
	const pools = 10
	var logs lockedBuffer
	var raw, ours hooks
	for range pools {
		r, err := pgxpool.NewWithConfig(ctx, config(&raw))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Exec(ctx, "select 1"); err != nil {
			t.Fatal(err)
		}
		r.Close()
		p, err := driver.NewPoolFromConfig(ctx, config(&ours), driver.WithConfig(cfg), driver.WithLogger(logs.logger()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Exec(ctx, "select 1"); err != nil {
			t.Fatal(err)
		}
		p.Close()
	}
	t.Logf("over %d new pools' first statement: pgxpool %d connections and %d PrepareConn calls, the Pool %d and %d",
		pools, raw.connects.Load(), raw.prepares.Load(), ours.connects.Load(), ours.prepares.Load())
	if got, want := ours.prepares.Load(), raw.prepares.Load(); got != want {
		t.Errorf("the first statements ran PrepareConn %d times, pgxpool's %d", got, want)
	}
	if got, want := ours.connects.Load(), raw.connects.Load(); got > want {
		t.Errorf("the first statements opened %d connections, pgxpool's %d", got, want)
	}

	p, err := driver.NewPoolFromConfig(ctx, config(new(hooks)), driver.WithConfig(cfg), driver.WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Exec(ctx, "purge"); !errors.Is(err, driver.ErrBlocked) {
		t.Errorf("the first statement, run by the name of a DELETE without WHERE that AfterConnect prepared: %v, want refused", err)
	}
}
