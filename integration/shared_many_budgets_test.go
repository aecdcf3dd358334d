package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestHungRedisServesNewTenantsBesideManyBudgets: one instance with 24 shared budgets (idle
// ones, as a budget per team would be) and one `per: tenant`. Redis hangs (SIGSTOP). The
// instance alone holds every budget, and while Redis is down the database keeps working: a new
// tenant's statements run on the fallback share (one instance: the whole max_concurrent) as
// soon as its budget's coordinator hands it over. When the budgets synced one after another,
// each failing call waiting for its deadline (250 ms), the new tenant had its share only after
// every other due budget's failing sync: its statements were refused meanwhile, for seconds.
func TestHungRedisServesNewTenantsBesideManyBudgets(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	var b strings.Builder
	fmt.Fprintf(&b, "coordination: {redis: %q, sync_interval: 1s}\nbudgets:\n", srv.URL)
	for i := range 24 {
		fmt.Fprintf(&b, "  - {name: team%02d, mode: enforce, max_concurrent: 8}\n", i)
	}
	b.WriteString("  - {name: tenants, mode: enforce, max_concurrent: 8, per: tenant}\nrules:\n")
	for i := range 24 {
		fmt.Fprintf(&b, "  - {budget: team%02d, match: {app: team%02d}}\n", i, i)
	}
	b.WriteString("  - {budget: tenants, match: {app: saas}}\n")
	var logs lockedBuffer
	_, db := openShared(t, dsn, b.String(), &logs)
	exec := func(tenant string) error {
		ctx := tagging.With(context.Background(), "app", "saas", "tenant", tenant)
		_, err := db.ExecContext(ctx, "select 1")
		return err
	}
	if !eventually(10*time.Second, func() bool { return exec("warm") == nil }) {
		t.Fatalf("a tenant's statement never ran with Redis up: %v", exec("warm"))
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Resume() })
	time.Sleep(4 * time.Second) // every lease lapsed; every budget's syncs fail
	const deadline = 250 * time.Millisecond
	var waits []time.Duration
	refused := 0
	for k := range 4 {
		tenant := fmt.Sprintf("new%d", k)
		begun := time.Now()
		for {
			err := exec(tenant)
			if err == nil {
				break
			}
			var be *driver.BlockedError
			if !errors.As(err, &be) {
				t.Fatalf("tenant %s: %v", tenant, err)
			}
			refused++
			if time.Since(begun) > 30*time.Second {
				t.Fatalf("tenant %s refused for 30s: %v", tenant, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		waits = append(waits, time.Since(begun))
	}
	worst := time.Duration(0)
	for _, w := range waits {
		worst = max(worst, w)
	}
	t.Logf("while Redis hung, new tenants' first statements ran after %v (%d refusals)", waits, refused)
	if worst > 2*deadline {
		t.Errorf("a new tenant's statements were refused for %v (%.1f sync deadlines) while Redis hung; the instance alone holds the whole budget",
			worst, float64(worst)/float64(deadline))
	}
}
