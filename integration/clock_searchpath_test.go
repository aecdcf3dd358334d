package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// TestClockSearchPathWithoutExtensionSchema: an application whose tables live in a schema
// of their own connects with search_path set to that schema (in the DSN, or by ALTER ROLE ...
// SET search_path, as schema-per-application deployments do), and pg_stat_statements was
// created as the README says ("create extension pg_stat_statements; -- in the application's
// database"), which puts it in public. The extension is loaded, created in the application's
// database and readable by the role: the README promises that pgtraffic then learns each
// pattern's cost from the server's clock. The user expects the lookup pattern to reach the
// server's clock. Today the reader's own connection inherits the application's search_path and
// queries pg_stat_statements_info and pg_stat_statements() unqualified: every read fails
// ("relation does not exist"), is taken for a missing extension, and the costs stay on the
// client's clock for good.
func TestClockSearchPathWithoutExtensionSchema(t *testing.T) {
	srv := pgtest.Shared(t)
	ctx := context.Background()
	dsn, admin := lookupDatabase(t, srv) // the extension in public, as create extension puts it
	if _, err := admin.Exec(ctx, `create schema app;
		create table app.t (id int primary key, v int);
		insert into app.t select g, g from generate_series(1, 1000) g; analyze app.t`); err != nil {
		t.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.RuntimeParams["search_path"] = "app"
	pc.MaxConns = 2
	cfg, err := driver.ParseConfig([]byte(`
health_interval: 100ms
budgets:
  - {name: lookups, mode: warn, server_share: 0.5}
rules:
  - {budget: lookups, match: {table: t}}
`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := driver.NewPoolFromConfig(ctx, pc, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	deadline := time.Now().Add(20 * time.Second)
	for {
		var v int
		if err := p.QueryRow(ctx, ssLookup, rand.IntN(1000)+1).Scan(&v); err != nil {
			t.Fatalf("a lookup failed: %v", err)
		}
		snap := p.Snapshot()
		ps, _ := lookupStatus(snap)
		if ps.Clock == driver.ClockServer {
			return
		}
		if time.Now().After(deadline) {
			c := snap.Counters
			t.Fatalf("the lookup pattern never reached the server's clock with pg_stat_statements created in the "+
				"application's database: pattern %+v; server clock reads %d, failures %d (search_path %q)",
				ps, c.ServerClockReads, c.ServerClockFailures, fmt.Sprint(pc.ConnConfig.RuntimeParams["search_path"]))
		}
		time.Sleep(2 * time.Millisecond)
	}
}
