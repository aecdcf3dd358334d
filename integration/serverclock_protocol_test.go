package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// TestServerClockSimpleProtocol: an application whose pool uses pgx's simple protocol (as is
// usual behind PgBouncer: default_query_exec_mode=simple_protocol) runs lookups under a
// server_share budget, pg_stat_statements loaded, created and readable. Its statements have
// their values written into their text, which the server identifies apart from the EXPLAIN's
// parameterised text: the README says such statements stay on the client's clock, and that a
// reader which finds no query identifier to read counts the failure and says why, rather than
// waiting on counters that never grow. The same pool on pgx's default protocol learns the
// server's clock.
func TestServerClockSimpleProtocol(t *testing.T) {
	for _, mode := range []string{"cache_statement", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			srv := pgtest.Shared(t)
			dsn, admin := lookupDatabase(t, srv)
			ctx := context.Background()
			pc, err := pgxpool.ParseConfig(dsn)
			if err != nil {
				t.Fatal(err)
			}
			if mode == "simple_protocol" {
				pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
			}
			cfg, err := driver.ParseConfig([]byte(`
health_interval: 200ms
budgets:
  - {name: lookups, mode: warn, server_share: 0.5, burst_limit: 1000s}
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
			wctx, stop := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() {
				defer close(done)
				for wctx.Err() == nil {
					var v int
					if err := p.QueryRow(wctx, ssLookup, rand.IntN(1000)+1).Scan(&v); err != nil && wctx.Err() == nil {
						t.Errorf("lookup: %v", err)
						return
					}
					time.Sleep(2 * time.Millisecond)
				}
			}()
			defer func() { stop(); <-done }()
			if mode == "cache_statement" {
				waitFor(t, 15*time.Second, "the lookup on the server's clock", func() (bool, string) {
					snap := p.Snapshot()
					ps, ok := lookupStatus(snap)
					return ok && ps.Clock == driver.ClockServer, fmt.Sprintf("%+v; reads %d failures %d; pg_stat_statements: %s", ps,
						snap.Counters.ServerClockReads, snap.Counters.ServerClockFailures, lookupEntries(t, admin))
				})
				return
			}
			waitFor(t, 15*time.Second, "the reader's failure for want of a query identifier", func() (bool, string) {
				snap := p.Snapshot()
				ps, ok := lookupStatus(snap)
				return ok && snap.Counters.ServerClockFailures > 0, fmt.Sprintf("%+v; reads %d failures %d", ps,
					snap.Counters.ServerClockReads, snap.Counters.ServerClockFailures)
			})
			if ps, _ := lookupStatus(p.Snapshot()); ps.Clock != driver.ClockClient {
				t.Errorf("the lookup on the simple protocol: clock %q, want the client's: %+v", ps.Clock, ps)
			}
		})
	}
}

// lookupEntries lists the top-level pg_stat_statements entries of the lookups' table in admin's
// database: query identifier, calls and text.
func lookupEntries(t *testing.T, admin *pgx.Conn) string {
	t.Helper()
	rows, err := admin.Query(context.Background(), `select queryid, calls, query from pg_stat_statements
		where dbid = (select oid from pg_database where datname = current_database()) and toplevel and query like '%from t where%'`)
	if err != nil {
		return err.Error()
	}
	var out []string
	for rows.Next() {
		var id, calls int64
		var q string
		if err := rows.Scan(&id, &calls, &q); err != nil {
			return err.Error()
		}
		out = append(out, fmt.Sprintf("[queryid %d, %d calls: %q]", id, calls, q))
	}
	return strings.Join(out, " ")
}
