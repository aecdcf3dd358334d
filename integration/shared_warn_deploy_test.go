package integration

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// TestSharedWarnInstanceDuringDeploy: a shared budget (max_concurrent 4, max_wait 1s) moved
// from warn to enforce by a rolling deploy. Instance A, still on warn, runs 10 workers, its
// statements beyond its lease running anyway (would-be waiters, or warned); instance B, already
// on enforce, runs 2. B must run as it runs beside an A that enforces too (each gets its share
// of the 4 slots), not be refused because A's statements beyond its lease count as held. The
// statements B completes beside a warn A, over those beside an enforce A, in one run.
func TestSharedWarnInstanceDuringDeploy(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	run := func(name, modeA string) (ran, refused int64) {
		rules := func(mode string) string {
			return fmt.Sprintf(`
coordination: {redis: %q, sync_interval: 200ms}
budgets:
  - {name: %s, mode: %s, max_concurrent: 4, max_wait: 1s}
rules:
  - {budget: %s, match: {app: fleet}}
`, srv.URL, name, mode, name)
		}
		var logs lockedBuffer
		_, a := openShared(t, dsn, rules(modeA), &logs)
		cb, b := openShared(t, dsn, rules("enforce"), &logs)
		a.SetMaxOpenConns(12)
		b.SetMaxOpenConns(4)
		if !eventually(5*time.Second, func() bool { return sharedStatus(t, cb, name).Instances == 2 }) {
			t.Fatalf("%s: %+v", name, sharedStatus(t, cb, name))
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var aRan, aRefused, bRan, bRefused atomic.Int64
		errs := make(chan error, 1)
		const q = "select pg_sleep(0.05)"
		wa := fleetLoad(ctx, a, q, 10, &aRan, &aRefused, errs)
		time.Sleep(time.Second) // A's lease first, as in a deploy
		wb := fleetLoad(ctx, b, q, 2, &bRan, &bRefused, errs)
		time.Sleep(2 * time.Second) // ten intervals to settle
		r0, f0 := bRan.Load(), bRefused.Load()
		time.Sleep(3 * time.Second)
		ran, refused = bRan.Load()-r0, bRefused.Load()-f0
		cancel()
		wa.Wait()
		wb.Wait()
		select {
		case err := <-errs:
			t.Fatalf("%s: %v", name, err)
		default:
		}
		return ran, refused
	}
	enforced, enforcedRefused := run("deploy_enforce", "enforce")
	warned, warnedRefused := run("deploy_warn", "warn")
	t.Logf("B beside an enforce A: %d ran, %d refused; beside a warn A: %d ran, %d refused",
		enforced, enforcedRefused, warned, warnedRefused)
	if enforced == 0 {
		t.Fatal("B ran nothing beside an enforce A")
	}
	if ratio := float64(warned) / float64(enforced); ratio < 0.7 {
		t.Errorf("B ran %.2f of its statements beside a warn A as beside an enforce one, want at least 0.7", ratio)
	}
}
