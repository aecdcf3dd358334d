package integration

import (
	"context"
	"errors"
	"reflect"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// TestPoolPreparedByNameIsGuarded: pgx runs a statement prepared on the connection when
// its name is passed as the SQL, and preparing a pool's statements in pgxpool's AfterConnect
// hook, then calling pool.Exec(ctx, "name"), is a common pgxpool idiom; NewPoolFromConfig's
// doc names AfterConnect among the hooks it keeps. A statement run by such a name is decided as
// the text it was prepared from, as one prepared in a transaction is, so that guards and rules
// see what the server runs: an unqualified DELETE that require_where: enforce refuses as text
// is refused when run by its name too (pg_query cannot parse the name, and no guard would read
// it as the write it is), even as the pool's first statement, before any connection exists.
func TestPoolPreparedByNameIsGuarded(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	setup, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Exec(context.Background(), "create table items (id int); insert into items values (1), (2)"); err != nil {
		t.Fatal(err)
	}
	setup.Close(context.Background())
	p := guardedPoolPreparing(t, dsn, "purge_items")
	ctx := context.Background()
	// The same statement as text is refused by the guard.
	if _, err := p.Exec(ctx, "delete from items"); !errors.Is(err, driver.ErrBlocked) {
		t.Fatalf("the unqualified delete as text: %v, want refused by require_where", err)
	}
	_, err = p.Exec(ctx, "purge_items")
	var n int
	if err := p.QueryRow(ctx, "select count(*) from items").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(err, driver.ErrBlocked) || n != 2 {
		t.Errorf("the same unqualified delete run by its prepared name: error %v, %d of 2 rows left; "+
			"want it refused by require_where: enforce and nothing deleted", err, n)
	}
}

// TestPoolPreparedByNameEverywhere: a statement the AfterConnect hook prepared is decided as
// its text wherever it is run by its name (the pool's first statement, a batch, a PoolConn, a
// transaction), and so is one prepared in a transaction when it runs on the pool after the
// transaction ended (it stays prepared on the connection). A statement prepared from a read
// runs by its name as before, with the sqlcommenter on too (a comment would make it another
// name). Pool.Config gives back the application's own hook.
func TestPoolPreparedByNameEverywhere(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	setup, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Exec(context.Background(), "create table items (id int); insert into items values (1), (2)"); err != nil {
		t.Fatal(err)
	}
	setup.Close(context.Background())
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	var hooks atomic.Int32 // the application's hook's calls
	pc.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		hooks.Add(1)
		if _, err := c.Prepare(ctx, "count_items", "select count(*) from items"); err != nil {
			return err
		}
		_, err := c.Prepare(ctx, "purge_items", "delete from items")
		return err
	}
	pc.MaxConns = 1 // one connection, whose hook ran once
	cfg, err := driver.ParseConfig([]byte(`guards: {require_where: enforce}`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := driver.NewPoolFromConfig(context.Background(), pc, driver.WithConfig(cfg), driver.WithSQLCommenter(true))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	count := func() int {
		t.Helper()
		var n int
		if err := p.QueryRow(ctx, "count_items").Scan(&n); err != nil {
			t.Fatalf("the read prepared by the hook, run by its name: %v", err)
		}
		return n
	}
	if n := count(); n != 2 {
		t.Fatalf("%d items, want 2", n)
	}
	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, driver.ErrBlocked) {
			t.Errorf("%s: %v, want refused by require_where", what, err)
		}
	}

	b := &pgx.Batch{}
	b.Queue("purge_items")
	br := p.SendBatch(ctx, b)
	_, err = br.Exec()
	br.Close()
	refused("a batch", err)

	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(ctx, "purge_items")
	refused("a PoolConn", err)
	c.Release()

	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, "purge_items")
	refused("a transaction", err)
	if _, err := tx.Prepare(ctx, "purge_in_tx", "delete from items"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = p.Exec(ctx, "purge_in_tx")
	refused("the pool, by a name prepared in a transaction", err)

	if n := count(); n != 2 {
		t.Errorf("%d items left, want 2: a delete run by its name was not refused", n)
	}
	if n := hooks.Load(); n != 1 {
		t.Errorf("the application's hook ran %d times on one connection, want once", n)
	}
	if reflect.ValueOf(p.Config().AfterConnect).Pointer() != reflect.ValueOf(pc.AfterConnect).Pointer() {
		t.Error("Pool.Config's AfterConnect is not the application's hook")
	}
}

// TestPoolFirstStatementByANameWithASpace: pgx takes any string as a prepared statement's name,
// "purge items" as well as "purge_items". Run by such a name as the pool's first statement or
// in its first batch, before any connection ran the AfterConnect hook, the unqualified DELETE
// is refused as its text is: the first statements that may be a name wait for the names.
func TestPoolFirstStatementByANameWithASpace(t *testing.T) {
	for _, first := range []string{"statement", "batch"} {
		t.Run(first, func(t *testing.T) {
			dsn := pgtest.Shared(t).CreateDatabase(t)
			raw := openRaw(t, dsn)
			mustExec(t, raw, context.Background(), "create table items (id int); insert into items values (1), (2)")
			p := guardedPoolPreparing(t, dsn, "purge items")
			ctx := context.Background()
			var err error
			if first == "statement" {
				_, err = p.Exec(ctx, "purge items")
			} else {
				b := &pgx.Batch{}
				b.Queue("purge items")
				err = p.SendBatch(ctx, b).Close()
			}
			if n := queryInt(t, raw, ctx, "select count(*) from items"); !errors.Is(err, driver.ErrBlocked) || n != 2 {
				t.Errorf("the pool's first %s, by the name \"purge items\": error %v, %d of 2 rows left; want refused, "+
					"nothing deleted", first, err, n)
			}
		})
	}
}

// guardedPoolPreparing opens a pool on dsn under require_where: enforce whose AfterConnect hook
// prepares "delete from items" as name on each connection.
func guardedPoolPreparing(t *testing.T, dsn, name string) *driver.Pool {
	t.Helper()
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Prepare(ctx, name, "delete from items")
		return err
	}
	cfg, err := driver.ParseConfig([]byte(`guards: {require_where: enforce}`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := driver.NewPoolFromConfig(context.Background(), pc, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}
