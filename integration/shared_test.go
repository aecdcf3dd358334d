package integration

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// openShared opens a connector on dsn with rules, logging into logs.
func openShared(t *testing.T, dsn, rules string, logs *lockedBuffer) (*driver.Connector, *sql.DB) {
	t.Helper()
	cfg, err := driver.ParseConfig([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	c, err := driver.NewConnector(dsn, driver.WithConfig(cfg), driver.WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { db.Close() })
	return c, db
}

// sharedStatus returns the shared part of budget name's status, failing when it has none.
func sharedStatus(t *testing.T, c *driver.Connector, name string) driver.SharedStatus {
	t.Helper()
	b := budgetStatus(t, c, name)
	if b.Shared == nil {
		t.Fatalf("budget %q is not shared: %+v", name, b)
	}
	return *b.Shared
}

// TestSharedMaxConcurrentAcrossConnectors: two connectors (two instances: each has its own
// coordinator and id) share max_concurrent 1 through a real Redis. While one runs a statement
// of the budget, the other's are refused for want of a slot, and once it ends the other gets
// the slot within a few sync intervals.
func TestSharedMaxConcurrentAcrossConnectors(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	rules := fmt.Sprintf(`
coordination: {redis: %q, sync_interval: 100ms}
budgets:
  - {name: one, mode: enforce, max_concurrent: 1}
rules:
  - {budget: one, match: {app: shared}}
`, srv.URL)
	var logs lockedBuffer
	ca, dbA := openShared(t, dsn, rules, &logs)
	cb, dbB := openShared(t, dsn, rules, &logs)
	ctx := tagging.With(context.Background(), "app", "shared")

	// Each instance's first statement meets a partition without a lease: retry until one is
	// admitted, so that both instances are known to Redis.
	for _, db := range []*sql.DB{dbA, dbB} {
		if !eventually(5*time.Second, func() bool { _, err := db.ExecContext(ctx, "select 1"); return err == nil }) {
			t.Fatal("no statement admitted within 5s")
		}
	}
	if a, b := ca.Snapshot(), cb.Snapshot(); a.Budgets[0].Shared.Instance == b.Budgets[0].Shared.Instance {
		t.Fatalf("both connectors are instance %q", a.Budgets[0].Shared.Instance)
	}

	// A takes the slot and holds it for 2s.
	holding := make(chan error, 1)
	started := time.Now()
	go func() {
		var err error
		for time.Since(started) < 5*time.Second {
			if _, err = dbA.ExecContext(ctx, "select pg_sleep(2)"); err == nil || !errors.Is(err, driver.ErrBlocked) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		holding <- err
	}()
	if !eventually(5*time.Second, func() bool { return budgetStatus(t, ca, "one").InFlight == 1 }) {
		t.Fatal("A's statement never started")
	}
	// B tries for a second (ten intervals) while A holds the slot: every try is refused.
	tries := 0
	for end := time.Now().Add(time.Second); time.Now().Before(end); tries++ {
		_, err := dbB.ExecContext(ctx, "select 1")
		if err == nil {
			t.Fatalf("B ran a statement while A held the only slot (try %d)", tries)
		}
		if be := asBlocked(t, err); be.Reason != driver.ReasonConcurrency {
			t.Fatalf("B refused for %q, want %q", be.Reason, driver.ReasonConcurrency)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s := sharedStatus(t, cb, "one"); s.Slots != 0 || s.Instances != 2 {
		t.Errorf("B while A holds the slot: %+v, want no slot and 2 instances", s)
	}
	if err := <-holding; err != nil {
		t.Fatalf("A: %v", err)
	}
	// The slot moves to B once A is done: at A's next syncs, a few intervals on a quiet machine.
	// The watchdog is generous, for this test runs beside every other package of the module
	// (how fast the slot moves is measured in virtual time: coord.TestSlotsHeadroomBound).
	if !eventually(10*time.Second, func() bool { _, err := dbB.ExecContext(ctx, "select 1"); return err == nil }) {
		t.Fatal("B got no slot within 10s of A's statement ending")
	}
	if strings.Contains(logs.String(), "unreachable") {
		t.Errorf("Redis was up, yet the log says:\n%s", logs.String())
	}
}

// TestSharedRedisDownAtOpen: with Redis unreachable at start (nothing listens on its port),
// the connector opens, the database is usable through the shared budget's fallback share,
// one line is logged, and neither the log nor the status page shows the URL's password.
func TestSharedRedisDownAtOpen(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // a port nothing listens on
	rules := fmt.Sprintf(`
coordination: {redis: "redis://:hunter2@%s/0", sync_interval: 100ms}
budgets:
  - {name: b, mode: enforce, max_concurrent: 20, server_share: 1, burst_limit: 10s}
rules:
  - {budget: b, match: {app: shared}}
`, addr)
	var logs lockedBuffer
	c, db := openShared(t, dsn, rules, &logs)
	ctx := tagging.With(context.Background(), "app", "shared")
	var last error
	if !eventually(5*time.Second, func() bool { _, last = db.ExecContext(ctx, "select 1"); return last == nil }) {
		t.Fatalf("the database is not usable with Redis down: %v; status %+v %+v", last, budgetStatus(t, c, "b"), sharedStatus(t, c, "b"))
	}
	// Plain statements outside the budget never depended on Redis.
	if _, err := db.Exec("select 1"); err != nil {
		t.Fatal(err)
	}
	// The first statement may be admitted on the provisional slot an instance holds before its
	// first sync; the failed sync follows within an interval. Its line is logged once the
	// status records it, and not again at the syncs that fail after it.
	var s driver.SharedStatus
	if !eventually(5*time.Second, func() bool { s = sharedStatus(t, c, "b"); return s.Fallback && s.Failures > 0 }) || s.Slots != 2 {
		t.Errorf("status with Redis down: %+v, want fallback, failures and 20/10 = 2 slots", s)
	}
	eventually(5*time.Second, func() bool {
		return sharedStatus(t, c, "b").Failures >= 2 && strings.Contains(logs.String(), "Redis unreachable")
	})
	if n := strings.Count(logs.String(), "Redis unreachable"); n != 1 {
		t.Errorf("logged %d times that Redis is unreachable, want once:\n%s", n, logs.String())
	}
	page, _ := json.Marshal(c.Snapshot())
	for what, text := range map[string]string{"log": logs.String(), "status": string(page)} {
		if strings.Contains(text, "hunter2") {
			t.Errorf("the %s shows the Redis password:\n%s", what, text)
		}
	}
}

// TestSharedThroughAGivenClient: driver.WithRedisClient replaces the section's URL (here
// absent), for Sentinel and Cluster clients that a URL cannot describe.
func TestSharedThroughAGivenClient(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	cfg, err := driver.ParseConfig([]byte(`
coordination: {sync_interval: 100ms}
budgets:
  - {name: b, mode: enforce, max_concurrent: 2}
rules:
  - {budget: b, match: {app: shared}}
`))
	if err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	defer rc.Close()
	c, err := driver.NewConnector(dsn, driver.WithConfig(cfg), driver.WithRedisClient(rc))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	defer db.Close()
	ctx := tagging.With(context.Background(), "app", "shared")
	if !eventually(5*time.Second, func() bool { _, err := db.ExecContext(ctx, "select 1"); return err == nil }) {
		t.Fatal("no statement admitted within 5s")
	}
	// The first statement may be admitted on the slot an instance holds before its first
	// sync; the sync through the given client follows within an interval.
	var s driver.SharedStatus
	if !eventually(5*time.Second, func() bool { s = sharedStatus(t, c, "b"); return s.Syncs > 0 }) || s.Instances != 1 || s.Fallback {
		t.Fatalf("status %+v, want syncs through the given client and one instance", s)
	}
	if n, err := rc.Keys(context.Background(), "pgtraffic:{b@*}:*").Result(); err != nil || len(n) == 0 {
		t.Fatalf("no key of budget b in the given client's Redis: %v %v", n, err)
	}
}

// TestSharedQuarantineAcrossConnectors: two connectors (two instances) on one Redis share a
// budget's quarantine. A statement overruns max_duration twice on A under quarantine: {after:
// 2, for: 30s}; within two of B's syncs after A's next one, B refuses the same pattern with
// reason quarantine and a RetryAfter of about 30 s, without sending it; another pattern of
// the budget runs on B; B's status lists the fingerprint as learnt from another instance.
// Once with a budget that has only max_duration (nothing to lease: it shares its quarantines
// alone), once with a concurrency limit beside it.
func TestSharedQuarantineAcrossConnectors(t *testing.T) {
	srv := redistest.Need(t)
	for _, tc := range []struct{ name, limits string }{
		{"max_duration only", ""},
		{"with max_concurrent", "max_concurrent: 10, "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := pgtest.Shared(t).CreateDatabase(t)
			budget := strings.ReplaceAll(tc.name, " ", "-")
			rules := fmt.Sprintf(`
coordination: {redis: %q, sync_interval: 100ms}
budgets:
  - {name: %s, mode: enforce, %smax_duration: 300ms, quarantine: {after: 2, for: 30s}}
rules:
  - {budget: %s, match: {app: reports}}
`, srv.URL, budget, tc.limits, budget)
			var logs lockedBuffer
			ca, dbA := openShared(t, dsn, rules, &logs)
			cb, dbB := openShared(t, dsn, rules, &logs)
			ctx := tagging.With(context.Background(), "app", "reports")
			for _, db := range []*sql.DB{dbA, dbB} {
				if err := execAdmitted(ctx, db, "select 1"); err != nil {
					t.Fatal(err)
				}
			}
			const slow = "select pg_sleep(5)"
			for range 2 {
				if err := execAdmitted(ctx, dbA, slow); !errors.Is(err, driver.ErrOverrun) {
					t.Fatalf("A: want an overrun, got %v", err)
				}
			}
			be := asBlocked(t, execAdmitted(ctx, dbA, slow))
			if be.Reason != driver.ReasonQuarantine {
				t.Fatalf("A after two overruns: %+v", be)
			}
			quarantined := time.Now()
			fp := be.Fingerprint

			// A publishes the quarantine at its next sync: after two more of A's syncs it
			// is in Redis. B reads it at its next sync after that; the count of syncs runs
			// one ahead of the hand-over to the engine, so by B's third sync from here B
			// must refuse the pattern.
			a0 := sharedStatus(t, ca, budget).Syncs
			if !eventually(10*time.Second, func() bool { return sharedStatus(t, ca, budget).Syncs >= a0+2 }) {
				t.Fatal("A made no two syncs within 10s")
			}
			b0 := sharedStatus(t, cb, budget).Syncs
			var refused *driver.BlockedError
			for end := time.Now().Add(10 * time.Second); refused == nil; {
				syncs := sharedStatus(t, cb, budget).Syncs
				err := execAdmitted(ctx, dbB, slow)
				switch {
				case err == nil:
					t.Fatal("B ran the slow statement to its end")
				case errors.Is(err, driver.ErrBlocked):
					refused = asBlocked(t, err)
				case !errors.Is(err, driver.ErrOverrun):
					t.Fatalf("B: %v", err)
				case syncs >= b0+3:
					t.Fatalf("B ran the quarantined pattern (overran) %d syncs after A published it", syncs-b0)
				case time.Now().After(end):
					t.Fatal("B never refused the pattern within 10s")
				}
			}
			if refused.Reason != driver.ReasonQuarantine || refused.Budget != budget || refused.Fingerprint != fp {
				t.Fatalf("B refused %+v, want reason quarantine for %s", refused, fp)
			}
			if left := time.Until(quarantined.Add(30 * time.Second)); refused.RetryAfter > 30*time.Second || refused.RetryAfter < left-5*time.Second {
				t.Fatalf("B's RetryAfter %v, want about %v", refused.RetryAfter, left)
			}
			if err := execAdmitted(ctx, dbB, "select pg_sleep(0.01)::text || 'other'"); err != nil {
				t.Fatalf("B, another pattern: %v", err)
			}
			var listed *driver.QuarantineStatus
			for _, q := range cb.Snapshot().Quarantines {
				if q.Fingerprint == fp {
					listed = &q
				}
			}
			if listed == nil || listed.Budget != budget || !listed.Remote || time.Until(listed.Until) > 30*time.Second {
				t.Fatalf("B's status lists %+v for %s, want it quarantined by another instance", cb.Snapshot().Quarantines, fp)
			}
			for _, q := range ca.Snapshot().Quarantines {
				if q.Fingerprint == fp && q.Remote {
					t.Errorf("A lists its own quarantine as another instance's: %+v", q)
				}
			}
			if strings.Contains(logs.String(), "unreachable") {
				t.Errorf("Redis was up, yet the log says:\n%s", logs.String())
			}
		})
	}
}

// execAdmitted runs q on db, trying again for up to 5s while it is refused for want of a
// slot: a partition idle for a few syncs gives its lease back, and a statement that meets
// it before the next lease is refused (reason concurrency).
func execAdmitted(ctx context.Context, db *sql.DB, q string) error {
	var err error
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		_, err = db.ExecContext(ctx, q)
		var be *driver.BlockedError
		if !errors.As(err, &be) || be.Reason != driver.ReasonConcurrency {
			return err
		}
	}
	return err
}
