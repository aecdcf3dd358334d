package integration

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// TestClockNoQueryIDCountedAndLogged: on a server where pg_stat_statements is not loaded
// (PostgreSQL's default: no shared_preload_libraries, so compute_query_id 'auto' computes
// nothing; simulated here with compute_query_id = off, one of the cases the README lists), the
// README says costs stay on the client's clock and "Failed reads are counted
// (pgtraffic.server_clock.failures, logged once until they work again)"; the issue's bad-input
// rule is that a missing pg_stat_statements "falls back to the client clock and counts the
// event". A user who adds a server_share budget expects some sign (a counted failure, a log
// line) that the server's clock is not in use. Today the reader, finding no pattern with a
// query identifier, never tries a read: no failure is counted and nothing is logged, for as long
// as the process runs, so the operator cannot tell "not available" from "not read yet".
func TestClockNoQueryIDCountedAndLogged(t *testing.T) {
	srv := pgtest.Shared(t)
	ctx := context.Background()
	dsn, _ := lookupDatabase(t, srv)
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.RuntimeParams["compute_query_id"] = "off"
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
	var logs lockedBuffer
	p, err := driver.NewPoolFromConfig(ctx, pc, driver.WithConfig(cfg), driver.WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	// 30 intervals of lookups: the reader runs a round every interval.
	end := time.Now().Add(3 * time.Second)
	for time.Now().Before(end) {
		var v int
		if err := p.QueryRow(ctx, ssLookup, rand.IntN(1000)+1).Scan(&v); err != nil {
			t.Fatalf("a lookup failed: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	snap := p.Snapshot()
	ps, _ := lookupStatus(snap)
	c := snap.Counters
	logged := strings.Contains(logs.String(), "server's clock")
	t.Logf("pattern %+v; server clock reads %d, failures %d, network floor %v; logged: %v", ps, c.ServerClockReads, c.ServerClockFailures, c.NetworkFloor, logged)
	if ps.Clock != driver.ClockClient {
		t.Fatalf("clock %q without query identifiers, want the client's", ps.Clock)
	}
	if c.ServerClockFailures == 0 && !logged {
		t.Errorf("the server's clock cannot be read (no query identifier) but after 30 intervals nothing says so: "+
			"%d reads, %d failures, nothing logged", c.ServerClockReads, c.ServerClockFailures)
	}
}
