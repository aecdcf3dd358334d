package integration

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// reviewConcurrent sends n statements of q at once on db and returns how many ran.
func reviewConcurrent(db *sql.DB, ctx context.Context, n int, q string) int {
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := db.ExecContext(ctx, q); err == nil {
				mu.Lock()
				ok++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return ok
}

func reviewRules(url, interval string, maxc int, extra string) string {
	return fmt.Sprintf(`
coordination: {redis: %q, sync_interval: %s}
budgets:
  - {name: slots, mode: enforce, max_concurrent: %d%s}
rules:
  - {budget: slots, match: {app: fleet}}
`, url, interval, maxc, extra)
}

// TestSharedClosedInstanceHandsSlotsBack: when one of two instances closes, the other
// soon holds the whole budget and runs max_concurrent statements at once.
func TestSharedClosedInstanceHandsSlotsBack(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	var logs lockedBuffer
	ca, dbA := openShared(t, dsn, reviewRules(srv.URL, "100ms", 4, ""), &logs)
	cb, dbB := openShared(t, dsn, reviewRules(srv.URL, "100ms", 4, ""), &logs)
	dbA.SetMaxOpenConns(8)
	ctx := tagging.With(context.Background(), "app", "fleet")
	for _, db := range []*sql.DB{dbA, dbB} {
		if err := execAdmitted(ctx, db, "select 1"); err != nil {
			t.Fatal(err)
		}
	}
	if !eventually(5*time.Second, func() bool { return sharedStatus(t, ca, "slots").Instances == 2 }) {
		t.Fatalf("A never saw B: %+v", sharedStatus(t, ca, "slots"))
	}
	dbB.Close()
	if err := cb.Close(); err != nil {
		t.Logf("close B: %v", err)
	}
	closed := time.Now()
	if !eventually(10*time.Second, func() bool {
		s := sharedStatus(t, ca, "slots")
		return s.Instances == 1 && s.Slots == 4
	}) {
		t.Fatalf("10s after B closed, A: %+v", sharedStatus(t, ca, "slots"))
	}
	t.Logf("A holds the whole budget %v after B closed", time.Since(closed))
	var got int
	if !eventually(10*time.Second, func() bool { got = reviewConcurrent(dbA, ctx, 4, "select pg_sleep(0.2)"); return got == 4 }) {
		t.Fatalf("A alone ran %d of 4 statements at once", got)
	}
}

// TestSharedUnshareReloadRestoresLocalLimit: a reload that says shared: false makes
// the budget process-local at once: the instance runs its whole max_concurrent, whatever
// another instance holds.
func TestSharedUnshareReloadRestoresLocalLimit(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	var logs lockedBuffer
	ca, dbA := openShared(t, dsn, reviewRules(srv.URL, "100ms", 4, ""), &logs)
	_, dbB := openShared(t, dsn, reviewRules(srv.URL, "100ms", 4, ""), &logs)
	dbA.SetMaxOpenConns(8)
	ctx := tagging.With(context.Background(), "app", "fleet")
	for _, db := range []*sql.DB{dbA, dbB} {
		if err := execAdmitted(ctx, db, "select 1"); err != nil {
			t.Fatal(err)
		}
	}
	if !eventually(5*time.Second, func() bool { return sharedStatus(t, ca, "slots").Instances == 2 }) {
		t.Fatalf("A never saw B: %+v", sharedStatus(t, ca, "slots"))
	}
	// B holds 3 slots for a while.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); reviewConcurrent(dbB, ctx, 3, "select pg_sleep(1.5)") }()
	time.Sleep(300 * time.Millisecond)
	cfg, err := driver.ParseConfig([]byte(reviewRules(srv.URL, "100ms", 4, ", shared: false")))
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	got := reviewConcurrent(dbA, ctx, 4, "select pg_sleep(0.2)")
	wg.Wait()
	if got != 4 {
		t.Errorf("after shared: false, A ran %d of 4 statements at once (local max_concurrent 4)", got)
	}
}

// TestSharedRaisedLimitReachesLoneInstance: a reload raising max_concurrent from 2
// to 5 on an instance alone: it soon runs 5 at once, as the same budget process-local would.
func TestSharedRaisedLimitReachesLoneInstance(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	var logs lockedBuffer
	c, db := openShared(t, dsn, reviewRules(srv.URL, "100ms", 2, ""), &logs)
	db.SetMaxOpenConns(8)
	ctx := tagging.With(context.Background(), "app", "fleet")
	if err := execAdmitted(ctx, db, "select 1"); err != nil {
		t.Fatal(err)
	}
	cfg, err := driver.ParseConfig([]byte(reviewRules(srv.URL, "100ms", 5, "")))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	var got int
	if !eventually(10*time.Second, func() bool { got = reviewConcurrent(db, ctx, 5, "select pg_sleep(0.2)"); return got == 5 }) {
		t.Fatalf("alone, after raising max_concurrent to 5, ran %d of 5 at once; status %+v", got, sharedStatus(t, c, "slots"))
	}
	// And lowered again: never more than 3.
	cfg, _ = driver.ParseConfig([]byte(reviewRules(srv.URL, "100ms", 3, "")))
	if err := c.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	// The reload asks for a sync at once; the lowered lease is the local budget's from the
	// hand-over that follows it, before the next sync.
	var s driver.SharedStatus
	if !eventually(10*time.Second, func() bool { s = sharedStatus(t, c, "slots"); return s.Slots == 3 }) {
		t.Fatalf("after lowering max_concurrent to 3, the lease: %+v", s)
	}
	if !eventually(10*time.Second, func() bool { return sharedStatus(t, c, "slots").Syncs > s.Syncs }) {
		t.Fatalf("no sync after the lowered lease: %+v", sharedStatus(t, c, "slots"))
	}
	if peak, ran := peakConcurrent(t, db, ctx, 6); peak > 3 {
		t.Errorf("after lowering max_concurrent to 3, ran %d at once (%d of 6 ran)", peak, ran)
	}
}

// peakConcurrent sends n statements of 0.2 s at once on db and returns the most that ran at
// once on the server and how many ran. Each statement reads its start (now(): its transaction's,
// an implicit one) and its end on the server's clock, within the time it held its slot: a
// statement that started after another ended, its goroutine or its connection late on a loaded
// machine, is not counted as running beside it.
func peakConcurrent(t *testing.T, db *sql.DB, ctx context.Context, n int) (peak, ran int) {
	t.Helper()
	type span struct{ from, to time.Time }
	var wg sync.WaitGroup
	var mu sync.Mutex
	var spans []span
	for range n {
		wg.Go(func() {
			var s span
			if err := db.QueryRowContext(ctx, "select now(), clock_timestamp() from pg_sleep(0.2)").Scan(&s.from, &s.to); err == nil {
				mu.Lock()
				spans = append(spans, s)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, a := range spans {
		at := 0 // the statements running when a started
		for _, b := range spans {
			if !b.from.After(a.from) && b.to.After(a.from) {
				at++
			}
		}
		peak = max(peak, at)
	}
	return peak, len(spans)
}

// TestSharedAuthRefused: a Redis that refuses the instance's credentials: the database
// stays usable on the fallback share, and the log says so once, with the reason, not every sync.
func TestSharedAuthRefused(t *testing.T) {
	srv := redistest.Need(t)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	if err := rc.ConfigSet(context.Background(), "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	dsn := pgtest.Shared(t).CreateDatabase(t)
	var logs lockedBuffer
	c, db := openShared(t, dsn, reviewRules(fmt.Sprintf("redis://:wrong@%s/0", srv.Addr), "100ms", 4, ""), &logs)
	ctx := tagging.With(context.Background(), "app", "fleet")
	var last error
	if !eventually(5*time.Second, func() bool { _, last = db.ExecContext(ctx, "select 1"); return last == nil }) {
		t.Fatalf("not usable with Redis refusing auth: %v; %+v", last, sharedStatus(t, c, "slots"))
	}
	time.Sleep(2 * time.Second)
	s := sharedStatus(t, c, "slots")
	out := logs.String()
	n := strings.Count(out, "\n")
	t.Logf("status %+v; log:\n%s", s, out)
	if !s.Fallback || s.Slots < 1 {
		t.Errorf("status %+v, want the fallback share", s)
	}
	if n > 3 {
		t.Errorf("%d log lines in 2s with Redis refusing auth", n)
	}
	if strings.Contains(out, "wrong") && strings.Contains(out, "redis://") {
		t.Errorf("log shows the URL")
	}
	if !strings.Contains(strings.ToLower(out), "auth") && !strings.Contains(out, "WRONGPASS") {
		t.Errorf("the log does not say the credentials were refused")
	}
}
