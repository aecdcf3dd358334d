package integration

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestHealthOneFailedReadIsNotStale: the README and driver/rules say a health
// sample counts as exceeded for an enforce budget when it is STALE, "older than three health
// intervals". A single failed read (here the sampler's backend is terminated between two
// rounds, as a failover proxy, an idle-connection reaper or a brief network cut does) leaves a
// good sample well under one interval old: the budget keeps admitting on it (the sampler
// reconnects at its next round), rather than refusing everything (reason health, "sample is
// stale") for a whole interval although nothing is older than three intervals.
func TestHealthOneFailedReadIsNotStale(t *testing.T) {
	const interval = 3 * time.Second
	var logs lockedBuffer
	dsn := pgtest.Shared(t).CreateDatabase(t)
	cfg, err := driver.ParseConfig([]byte(fmt.Sprintf(`
health_interval: %s
budgets:
  - {name: batch, mode: enforce, throttle_when: {active_queries: 1000}}
rules:
  - {budget: batch, match: {job: import}}
`, interval)))
	if err != nil {
		t.Fatal(err)
	}
	c, err := driver.NewConnector(dsn, driver.WithConfig(cfg), driver.WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	batch := tagging.With(ctx, "job", "import")
	waitFor(t, healthSettle, "the first health sample admits the batch", func() (bool, string) {
		err := c.Check(batch)
		return err == nil, fmt.Sprint(err)
	})
	var dbname string
	if err := db.QueryRowContext(ctx, "select current_database()").Scan(&dbname); err != nil {
		t.Fatal(err)
	}
	mark := len(logs.String())
	ctl, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close(ctx)
	// Wait until the sampler has read active_queries on its connection twice (its backend idle
	// after that query, begun at a later time than the first seen): the first round's sample is
	// then published (a loaded client may not have received the latest round's reply when the
	// server has gone idle), and the next round is about an interval away.
	var firstRound time.Time
	waitFor(t, 2*interval+healthSettle, "the sampler has a good sample", func() (bool, string) {
		var started time.Time
		err := ctl.QueryRow(ctx, `select query_start from pg_stat_activity where application_name = 'pgtraffic-health'
			and datname = $1 and state = 'idle' and query like 'select count(*) from pg_stat_activity%'`, dbname).Scan(&started)
		if err != nil {
			return false, err.Error()
		}
		if firstRound.IsZero() {
			firstRound = started
		}
		return started.After(firstRound), fmt.Sprint("rounds begun at ", firstRound, " and ", started)
	})
	if err := c.Check(batch); err != nil {
		t.Fatalf("Check on a good sample: %v", err)
	}
	var n int
	if err := ctl.QueryRow(ctx, `select count(pg_terminate_backend(pid)) from pg_stat_activity
		where application_name = 'pgtraffic-health' and datname = $1`, dbname).Scan(&n); err != nil || n != 1 {
		t.Fatalf("terminating the sampler's backend: %d terminated, %v", n, err)
	}
	killed := time.Now()
	// The sampler's next round finds its connection gone.
	waitFor(t, 2*interval+healthSettle, "the sampler's next round fails", func() (bool, string) {
		return strings.Contains(logs.String()[mark:], "health: metric read failed"), logs.String()[mark:]
	})
	failedAt := time.Since(killed)
	// The last good sample is at most about one interval old: far from stale (3 intervals).
	err = c.Check(batch)
	if age := time.Since(killed); err != nil && age < 2*interval {
		t.Errorf("Check %v after the sampler lost its connection (its next read failed after %v; the last good "+
			"sample is about one interval, %v, old and stale only after %v) = %v; want nil: one failed read is not a stale sample",
			age.Round(time.Millisecond), failedAt.Round(time.Millisecond), interval, 3*interval, err)
	}
	if _, err := db.ExecContext(batch, "select 1"); err != nil && time.Since(killed) < 2*interval {
		t.Errorf("a batch statement right after one failed health read = %v; want it admitted", err)
	}
}
