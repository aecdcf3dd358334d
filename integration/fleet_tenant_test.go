package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestFleetQuietTenantAloneNeverRefused: one instance, a shared budget `per: tenant`
// with `max_concurrent: 8` and no `max_wait`, and a tenant that sends one statement every
// couple of seconds (a quiet tenant of a SaaS: most of them are). Nothing else runs. The README
// ("Shared budgets") says that one instance alone holds the whole budget and refuses nothing
// the same budget process-local would admit, which admits every one of these statements (at
// most one of 8 slots is ever taken). Shared, the tenant's partition is left after idle syncs,
// so each statement after a quiet spell meets a partition with no lease: it runs on its
// provisional lease (alone, the whole budget) rather than being refused for "concurrency"
// with nothing in flight every time, for as long as the tenant stays quiet.
func TestFleetQuietTenantAloneNeverRefused(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	const rulesFmt = `
coordination: {redis: %q, sync_interval: 200ms}
budgets:
  - {name: tenants, mode: enforce, per: tenant, max_concurrent: 8%s}
rules:
  - {budget: tenants, match: {app: saas}}
`
	var logs lockedBuffer
	_, shared := openShared(t, dsn, fmt.Sprintf(rulesFmt, srv.URL, ""), &logs)
	_, local := openShared(t, dsn, fmt.Sprintf(rulesFmt, srv.URL, ", shared: false"), &logs)
	ctx := tagging.With(context.Background(), "app", "saas", "tenant", "quiet")
	// Warm up: the tenant's first statement ever may wait for its first lease (README); let
	// it run once on each connector, retrying, so that what follows is a tenant already seen.
	if err := execAdmitted(ctx, shared, "select 1"); err != nil {
		t.Fatalf("warm-up on the shared budget: %v", err)
	}
	if err := execAdmitted(ctx, local, "select 1"); err != nil {
		t.Fatalf("warm-up on the local budget: %v", err)
	}
	const rounds = 4
	sharedRefused, localRefused := 0, 0
	var last error
	for range rounds {
		time.Sleep(2 * time.Second) // ten sync intervals of quiet
		if _, err := local.ExecContext(ctx, "select 1"); err != nil {
			if !errors.Is(err, driver.ErrBlocked) {
				t.Fatal(err)
			}
			localRefused++
		}
		if _, err := shared.ExecContext(ctx, "select 1"); err != nil {
			if !errors.Is(err, driver.ErrBlocked) {
				t.Fatal(err)
			}
			sharedRefused++
			last = err
		}
	}
	t.Logf("quiet tenant, %d statements: process-local refused %d, shared refused %d (%v)", rounds, localRefused, sharedRefused, last)
	if localRefused != 0 {
		t.Fatalf("the process-local twin refused %d statements: the scenario is wrong", localRefused)
	}
	if sharedRefused > 0 {
		t.Errorf("one instance alone under a shared max_concurrent of 8 refused %d of %d statements of a quiet tenant "+
			"with nothing else in flight (the process-local budget refused none): %v", sharedRefused, rounds, last)
	}
}
