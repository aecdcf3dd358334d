package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// patternClock returns the status of the pattern whose query contains frag in snap.
func patternClock(snap driver.Snapshot, frag string) (driver.PatternStatus, bool) {
	for _, ps := range snap.Patterns {
		if strings.Contains(ps.Query, frag) {
			return ps, true
		}
	}
	return driver.PatternStatus{}, false
}

// TestServerClockFollowerOwnPatterns: two instances of two services share a coordination
// section and one database (a shared budget across an API and a worker). With
// pg_stat_statements readable, pgtraffic learns each pattern's mean server time; the elected
// instance reads the query identifiers it knows and publishes what it learned, the others
// adopt the means of the identifiers they know and read for themselves those it did not
// publish. Each instance runs a pattern of its own: each pattern must reach the server's clock.
func TestServerClockFollowerOwnPatterns(t *testing.T) {
	rs := redistest.Need(t)
	srv := pgtest.Shared(t)
	dsn, admin := lookupDatabase(t, srv)
	ins := openElected(t, rs, dsn, `
coordination: {sync_interval: 200ms}
health_interval: 200ms
budgets:
  - {name: lookups, mode: warn, server_share: 0.5, burst_limit: 1000s}
rules:
  - {budget: lookups, match: {table: t}}
`, 2)
	queries := []string{`select v from t where id = $1`, `select id from t where v = $1`}
	frags := []string{"select v from t where id", "select id from t where v"}
	wctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	for i, in := range ins {
		wg.Go(func() {
			for wctx.Err() == nil {
				var v int
				if err := in.db.QueryRowContext(wctx, queries[i], rand.IntN(1000)+1).Scan(&v); err != nil && wctx.Err() == nil {
					t.Errorf("instance %d: %v", i, err)
					return
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	waitFor(t, 20*time.Second, "each instance's own pattern on the server's clock", func() (bool, string) {
		ok := true
		var state []string
		for i, in := range ins {
			snap := in.c.Snapshot()
			ps, found := patternClock(snap, frags[i])
			ok = ok && found && ps.Clock == driver.ClockServer
			state = append(state, fmt.Sprintf("instance %d: pattern %q clock %q server mean %.3g s, client mean %.3g s; reads %d, shared %d, failures %d",
				i, frags[i], ps.Clock, ps.ServerMean, ps.ClientMean, snap.Counters.ServerClockReads, snap.Counters.ServerClockShared, snap.Counters.ServerClockFailures))
		}
		return ok, strings.Join(state, "; ") + "; pg_stat_statements: " + lookupEntries(t, admin)
	})
}
