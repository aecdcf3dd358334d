package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	pgtdriver "github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/coord"
	"github.com/pgtraffic/pgtraffic/internal/pattern"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// A writer of Redis plants, in a shared budget's quarantine hash, an entry for a real pattern
// ending in the far future, and junk (bad fingerprints, non-numbers, inf, nan). The pattern may
// be refused, but for no longer than the budget's for: (3s) from when it was read: it runs again
// within a few seconds; the junk refuses nothing.
func TestOverrunSharedHostileQuarantine(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	rules := fmt.Sprintf(`
coordination: {redis: %q, sync_interval: 100ms}
budgets:
  - {name: hq, mode: enforce, max_duration: 300ms, quarantine: {after: 3, for: 3s}}
rules:
  - {budget: hq, match: {app: reports}}
`, srv.URL)
	var logs lockedBuffer
	c, db := openShared(t, dsn, rules, &logs)
	ctx := tagging.With(context.Background(), "app", "reports")
	const q = "select pg_sleep(0.01)"
	if _, err := db.ExecContext(ctx, q); err != nil {
		t.Fatal(err)
	}
	fp := pattern.Analyze(q).Fingerprint
	if len(fp) != 16 {
		t.Fatalf("fingerprint %q", fp)
	}
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	key := coord.QuarantineKey(serverIdentity(cc), "hq", coord.QuarantineSpec{After: 3, For: 3 * time.Second})
	if err := rc.HSet(ctx, key, fp, "9000000000000000000", "ZZZZZZZZZZZZZZZZ", "1", "0123456789ABCDEF", "99999999999999999",
		"0000000000000001", "inf", "0000000000000002", "nan", "0000000000000003", "-5").Err(); err != nil {
		t.Fatal(err)
	}
	planted := time.Now()
	var refused *pgtdriver.BlockedError
	eventually(3*time.Second, func() bool {
		_, err := db.ExecContext(ctx, q)
		return errors.As(err, &refused)
	})
	if refused != nil {
		t.Logf("refused: %+v", refused)
		if refused.RetryAfter > 3*time.Second {
			t.Errorf("RetryAfter %v beyond for: 3s", refused.RetryAfter)
		}
	} else {
		t.Logf("the planted entry never refused the pattern")
	}
	for _, qq := range c.Snapshot().Quarantines {
		if time.Until(qq.Until) > 3*time.Second {
			t.Errorf("status: quarantine %+v ends %v from now", qq, time.Until(qq.Until))
		}
		if qq.Fingerprint != fp {
			t.Errorf("junk listed as a quarantine: %+v", qq)
		}
	}
	// Back within for: plus a few syncs.
	if !eventually(10*time.Second, func() bool {
		_, err := db.ExecContext(ctx, q)
		return err == nil
	}) {
		_, err := db.ExecContext(ctx, q)
		t.Fatalf("%v after planting, the pattern is still refused: %v", time.Since(planted), err)
	}
	t.Logf("admitted again %v after planting", time.Since(planted).Round(100*time.Millisecond))
	// And stays admitted: the planted entry does not come back.
	time.Sleep(time.Second)
	if _, err := db.ExecContext(ctx, q); err != nil {
		t.Errorf("refused again later: %v", err)
	}
	if n, _ := rc.HLen(ctx, key).Result(); n > 0 {
		all, _ := rc.HGetAll(ctx, key).Result()
		t.Logf("left in Redis: %v", all)
	}
}

// A shared budget reloaded, while a statement admitted under quarantine {after: 1, for: 1h} is
// running, to {after: 5, for: 10s}: the statement's overrun after the reload must not quarantine
// the pattern for an hour on this instance (see TestOverrunQuarantineReloadInFlight), nor
// on another instance already on the new settings.
func TestOverrunSharedReloadInFlight(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	mk := func(q string) string {
		return fmt.Sprintf(`
coordination: {redis: %q, sync_interval: 100ms}
budgets:
  - {name: rq, mode: enforce, max_duration: 800ms, quarantine: %s}
rules:
  - {budget: rq, match: {app: reports}}
`, srv.URL, q)
	}
	var logs lockedBuffer
	ca, dbA := openShared(t, dsn, mk("{after: 1, for: 1h}"), &logs)
	_, dbB := openShared(t, dsn, mk("{after: 5, for: 10s}"), &logs)
	ctx := tagging.With(context.Background(), "app", "reports")
	done := make(chan error, 1)
	go func() {
		_, err := dbA.ExecContext(ctx, "select pg_sleep(5)")
		done <- err
	}()
	if !eventually(5*time.Second, func() bool { return budgetStatus(t, ca, "rq").InFlight == 1 }) {
		t.Fatal("never started")
	}
	time.Sleep(100 * time.Millisecond)
	setRulesOn(t, ca, mk("{after: 5, for: 10s}"))
	if err := <-done; !errors.Is(err, pgtdriver.ErrOverrun) {
		t.Fatalf("in flight: %v", err)
	}
	time.Sleep(time.Second) // a few syncs
	var be *pgtdriver.BlockedError
	if _, err := dbA.ExecContext(ctx, "select pg_sleep(0.01)"); errors.As(err, &be) && be.RetryAfter > 10*time.Second {
		t.Errorf("A: quarantined for %v under for: 10s", be.RetryAfter)
	}
	be = nil
	if _, err := dbB.ExecContext(ctx, "select pg_sleep(0.01)"); errors.As(err, &be) && be.RetryAfter > 10*time.Second {
		t.Errorf("B: quarantined for %v under for: 10s", be.RetryAfter)
	} else if be != nil {
		t.Errorf("B, on {after: 5, for: 10s} since it started, refuses after a single overrun: %v", be)
	}
}
