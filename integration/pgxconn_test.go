package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// TestRawPgxIdiom does what pgx's documentation and pgx-based libraries do through
// (*sql.Conn).Raw: assert the driver connection's Conn method and use the *pgx.Conn. It used to
// panic (pgtraffic's connection is not a *stdlib.Conn and had no Conn method).
func TestRawPgxIdiom(t *testing.T) {
	ctx := context.Background()
	_, pgt, _ := openBoth(t)
	if _, err := pgt.Exec(`create table raw_copied (id int)`); err != nil {
		t.Fatal(err)
	}
	c, err := pgt.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var pid uint32
	err = c.Raw(func(dc any) error {
		pc, ok := dc.(interface{ Conn() *pgx.Conn })
		if !ok {
			return fmt.Errorf("the driver connection %T has no Conn() *pgx.Conn method", dc)
		}
		conn := pc.Conn()
		pid = conn.PgConn().PID()
		n, err := conn.CopyFrom(ctx, pgx.Identifier{"raw_copied"}, []string{"id"},
			pgx.CopyFromRows([][]any{{1}, {2}, {3}}))
		if err == nil && n != 3 {
			err = fmt.Errorf("copied %d rows, want 3", n)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// The *pgx.Conn was the sql.Conn's own connection.
	var backend uint32
	if err := c.QueryRowContext(ctx, "select pg_backend_pid()").Scan(&backend); err != nil {
		t.Fatal(err)
	}
	if backend != pid {
		t.Errorf("Raw's *pgx.Conn is backend %d, the sql.Conn's is %d", pid, backend)
	}
	var n int
	if err := c.QueryRowContext(ctx, "select count(*) from raw_copied").Scan(&n); err != nil || n != 3 {
		t.Fatalf("count after CopyFrom = %d, %v; want 3", n, err)
	}
}

// TestNewConnectorFromConfig opens a database from a *pgx.ConnConfig adjusted in code, as pgx's
// stdlib.OpenDB callers do: the adjustments reach every connection (and the health sampler's
// config is a copy, not the caller's), and traffic control applies.
func TestNewConnectorFromConfig(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.Shared(t).CreateDatabase(t)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "from-config"
	var notices []string // written by the connection's goroutine during the statement
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Message) }
	rules, err := driver.ParseConfig([]byte(`
budgets:
  - name: app
    mode: enforce
    max_concurrent: 5
rules:
  - budget: app
    match: {application_name: from-config}
guards:
  require_where: enforce
`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := driver.NewConnectorFromConfig(cfg, driver.WithConfig(rules))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	defer db.Close()
	cfg.RuntimeParams["application_name"] = "changed-later" // the connector kept a copy

	var app string
	if err := db.QueryRowContext(ctx, "select current_setting('application_name')").Scan(&app); err != nil {
		t.Fatal(err)
	}
	if app != "from-config" {
		t.Errorf("application_name = %q, want from-config", app)
	}
	if _, err := db.ExecContext(ctx, "do $$ begin raise notice 'hello from the server'; end $$"); err != nil {
		t.Fatal(err)
	}
	if len(notices) != 1 || notices[0] != "hello from the server" {
		t.Errorf("OnNotice saw %q, want the server's notice", notices)
	}
	if _, err := db.ExecContext(ctx, "create table fc (id int)"); err != nil {
		t.Fatal(err)
	}
	_, err = db.ExecContext(ctx, "delete from fc")
	if !errors.Is(err, driver.ErrBlocked) {
		t.Errorf("unqualified delete through a connector from a config: %v, want blocked by the guard", err)
	}
	snap := c.Snapshot()
	found := false
	for _, b := range snap.Budgets {
		if b.Name == "app" && b.Admitted > 0 {
			found = true
		}
	}
	if !found {
		t.Errorf("the app budget admitted nothing: %+v", snap.Budgets)
	}
}
