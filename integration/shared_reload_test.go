package integration

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// fleetMost runs 6 workers per db for d after settle, sampling pg_stat_activity, and
// returns the most statements with marker running at once.
func fleetMost(t *testing.T, admin *sql.DB, dbs []*sql.DB, marker string, settle, d time.Duration) (most int, ran, refused int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var r, f atomic.Int64
	errs := make(chan error, 1)
	var wgs []*sync.WaitGroup
	q := fmt.Sprintf("select pg_sleep(0.05), '%s'", marker)
	for _, db := range dbs {
		wgs = append(wgs, fleetLoad(ctx, db, q, 6, &r, &f, errs))
	}
	time.Sleep(settle)
	for end := time.Now().Add(d); time.Now().Before(end); {
		most = max(most, activeOf(t, admin, marker))
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	for _, wg := range wgs {
		wg.Wait()
	}
	select {
	case err := <-errs:
		t.Fatalf("error: %v", err)
	default:
	}
	return most, r.Load(), f.Load()
}

// TestSharedCoordinationChangeKeepsSharing: two instances share max_concurrent 2. A
// reload that changes only the coordination section's sync_interval (a new coordinator
// replaces the old one) must keep the budget shared: the fleet still runs at most 2 of its
// statements at once.
func TestSharedCoordinationChangeKeepsSharing(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	rules := func(interval string) string {
		return fmt.Sprintf(`
coordination: {redis: %q, sync_interval: %s}
budgets:
  - {name: slots, mode: enforce, max_concurrent: 2}
rules:
  - {budget: slots, match: {app: fleet}}
`, srv.URL, interval)
	}
	var logs lockedBuffer
	var cs []*driver.Connector
	var dbs []*sql.DB
	for range 2 {
		c, db := openShared(t, dsn, rules("100ms"), &logs)
		db.SetMaxOpenConns(8)
		cs, dbs = append(cs, c), append(dbs, db)
	}
	for i, c := range cs {
		if !eventually(5*time.Second, func() bool { return sharedStatus(t, c, "slots").Instances == 2 }) {
			t.Fatalf("instance %d: %+v", i, sharedStatus(t, c, "slots"))
		}
	}
	before, _, _ := fleetMost(t, admin, dbs, "reviewbefore", time.Second, 1500*time.Millisecond)
	cfg, err := driver.ParseConfig([]byte(rules("150ms")))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if err := c.SetConfig(cfg); err != nil {
			t.Fatal(err)
		}
	}
	after, ran, refused := fleetMost(t, admin, dbs, "reviewafter", time.Second, 2*time.Second)
	t.Logf("before the reload at most %d at once; after it at most %d (%d ran, %d refused); status A %+v B %+v",
		before, after, ran, refused, sharedStatus(t, cs[0], "slots"), sharedStatus(t, cs[1], "slots"))
	if before > 2 {
		t.Errorf("before the reload the fleet ran %d statements at once, limit 2", before)
	}
	if after > 2 {
		t.Errorf("after a reload that changed only sync_interval the fleet ran %d statements at once, limit 2 (shared)", after)
	}
}
