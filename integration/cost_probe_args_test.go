package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
)

// After a cheap statement of a pattern runs as its probe, an expensive statement of the same
// pattern (its plan thousands of times the cheap one's) must still be refused by
// per_query_limit: the probe must not teach a k that makes every argument look cheap.
func TestCostProbeOfCheapArgsAdmitsExpensiveArgs(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a probe (10s)")
	}
	db, _ := openBudgeted(t, "per_query_limit: 200ms", bigJoinTable...)
	ctx := context.Background()
	const q = `select count(*) from rv a join rv b on a.v <> b.v where a.id < $1 and b.id < $1`
	var n int64
	if err := db.QueryRowContext(ctx, q, 200000).Scan(&n); !errors.Is(err, driver.ErrBlocked) {
		t.Fatalf("huge argument: %v, want refused", err)
	}
	time.Sleep(10500 * time.Millisecond) // cost.Relearn
	if err := db.QueryRowContext(ctx, q, 10).Scan(&n); err != nil {
		t.Fatalf("cheap argument (the probe): %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	t0 := time.Now()
	err := db.QueryRowContext(cctx, q, 200000).Scan(&n)
	took := time.Since(t0)
	var be *driver.BlockedError
	if !errors.As(err, &be) {
		t.Fatalf("huge argument after the cheap probe: admitted and ran %v (cut by the test's 3s deadline: %v); want refused by per_query_limit 200ms", took.Round(time.Millisecond), err)
	}
}

// explain: call: a pattern first run with a cheap argument, then with an argument whose plan is
// millions of times larger, within a minute: per_query_limit refuses the second before it runs
// (under explain: auto the cached plan of the cheap one would price it; README).
func TestCostCheapThenExpensiveArgsCall(t *testing.T) {
	db, _ := openBudgeted(t, "per_query_limit: 200ms, explain: call", bigJoinTable...)
	ctx := context.Background()
	const q = `select count(*) from rv a join rv b on a.v <> b.v where a.id < $1 and b.id < $1`
	var n int64
	if err := db.QueryRowContext(ctx, q, 10).Scan(&n); err != nil {
		t.Fatalf("cheap argument: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	t0 := time.Now()
	err := db.QueryRowContext(cctx, q, 200000).Scan(&n)
	if !errors.Is(err, driver.ErrBlocked) {
		t.Fatalf("huge argument after a cheap one: admitted and ran %v (%v); want refused by per_query_limit 200ms", time.Since(t0).Round(time.Millisecond), err)
	}
}
