package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestHealthSamplerUsesBeforeConnect: credentials that rotate (AWS RDS IAM tokens, Azure AD
// tokens, a Vault lease) are set per connection in pgxpool.Config.BeforeConnect, or in
// stdlib.OptionBeforeConnect for database/sql (driver.WithPgxOptions). The health sampler's own
// connection must be made through the same hook: without the password it cannot log in, every
// health metric goes stale, and an enforce budget with throttle_when refuses every statement it
// selects while the server is healthy.
func TestHealthSamplerUsesBeforeConnect(t *testing.T) {
	srv := privateServer(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var hba string
	if err := admin.QueryRow(ctx, "show hba_file").Scan(&hba); err != nil {
		t.Fatal(err)
	}
	// The superuser keeps trust; the application's role must give its password.
	for _, q := range []string{
		"create role app login password 'rotating-secret'",
		"grant pg_read_all_stats to app",
		fmt.Sprintf(`copy (select unnest(array[
			'local all all trust',
			'host all postgres 127.0.0.1/32 trust',
			'host all app 127.0.0.1/32 scram-sha-256'])) to '%s'`, hba),
		"select pg_reload_conf()",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	dsn := fmt.Sprintf("postgres://app@127.0.0.1:%d/postgres?sslmode=disable", srv.Port)
	hook := func(_ context.Context, cc *pgx.ConnConfig) error {
		cc.Password = "rotating-secret" // a fresh token, as an IAM auth hook sets it
		return nil
	}
	cfg, err := driver.ParseConfig([]byte(`
health_interval: 200ms
budgets:
  - {name: batch, mode: enforce, throttle_when: {active_queries: 1000}}
rules:
  - {budget: batch, match: {job: import}}
`))
	if err != nil {
		t.Fatal(err)
	}
	batch := tagging.With(ctx, "job", "import")

	check := func(t *testing.T, plain func() error, c interface{ Check(context.Context) error }, tagged func() error) {
		if err := plain(); err != nil {
			t.Fatalf("an untagged statement through the hook: %v (the hook does not work at all)", err)
		}
		deadline := time.Now().Add(5 * time.Second)
		var last error
		for time.Now().Before(deadline) {
			if last = c.Check(batch); last == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if last != nil {
			t.Errorf("Check of a healthy server 5 s after start = %v; want nil (the sampler must connect as the "+
				"application does, BeforeConnect included)", last)
		}
		if err := tagged(); err != nil {
			t.Errorf("a tagged statement on a healthy server = %v; want it admitted", err)
			if !errors.Is(err, driver.ErrBlocked) {
				t.Fatal(err)
			}
		}
	}

	t.Run("pgx pool BeforeConnect", func(t *testing.T) {
		pcfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		pcfg.BeforeConnect = hook
		p, err := driver.NewPoolFromConfig(ctx, pcfg, driver.WithConfig(cfg))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		check(t, func() error { _, err := p.Exec(ctx, "select 1"); return err }, p,
			func() error { _, err := p.Exec(batch, "select 1"); return err })
	})
	t.Run("database/sql OptionBeforeConnect", func(t *testing.T) {
		c, err := driver.NewConnector(dsn, driver.WithConfig(cfg), driver.WithPgxOptions(stdlib.OptionBeforeConnect(hook)))
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(c)
		t.Cleanup(func() { db.Close() })
		check(t, func() error { _, err := db.ExecContext(ctx, "select 1"); return err }, c,
			func() error { _, err := db.ExecContext(batch, "select 1"); return err })
	})
}
