package integration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/delayproxy"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestSharedCoordinationReloadAloneNeverRefused: one instance alone runs 8 workers of a cheap
// statement under a shared max_concurrent: 64, Redis 5 ms away, while reloads change only
// coordination.sync_interval. Each reload replaces the coordinator, which hands its budgets
// over to the new one under the same name in Redis; the new one must go on with the whole
// budget, whether or not its first sync is answered. An instance alone never has more than 8
// of its 64 slots in flight: no statement may be refused for concurrency, before, during or
// after the reloads.
func TestSharedCoordinationReloadAloneNeverRefused(t *testing.T) {
	srv := redistest.Need(t)
	px := delayproxy.Start(t, srv.Addr, 5*time.Millisecond)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	rules := func(interval string) *driver.Config {
		cfg, err := driver.ParseConfig([]byte(fmt.Sprintf(`
coordination: {redis: "redis://%s/0", sync_interval: %s}
budgets:
  - {name: slots, mode: enforce, max_concurrent: 64}
rules:
  - {budget: slots, match: {app: fleet}}
`, px.Addr, interval)))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	var logs lockedBuffer
	p, err := driver.NewPool(context.Background(), dsn, driver.WithConfig(rules("100ms")), driver.WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if !eventually(5*time.Second, func() bool { return sharedStatusOf(t, p, "slots").Instances == 1 }) {
		t.Fatalf("not synced: %+v", sharedStatusOf(t, p, "slots"))
	}

	const workers, reloads = 8, 40
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ran, refused atomic.Int64
	var firstRefusal atomic.Value
	// after[i] counts the refusals after reload i began and before reload i+1 (after[0]: before
	// any reload).
	var after [reloads + 1]atomic.Int64
	var at atomic.Int64
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	tagged := tagging.With(context.Background(), "app", "fleet")
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				_, err := p.Exec(tagged, "select 1")
				var be *driver.BlockedError
				switch {
				case err == nil:
					ran.Add(1)
				case errors.As(err, &be):
					refused.Add(1)
					after[at.Load()].Add(1)
					firstRefusal.CompareAndSwap(nil, be.Error())
					time.Sleep(time.Millisecond)
				default:
					select {
					case errs <- err:
					default:
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	intervals := []string{"150ms", "100ms"}
	for i := range reloads {
		at.Store(int64(i + 1))
		if err := p.SetConfig(rules(intervals[i%2])); err != nil {
			t.Fatal(err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("error: %v", err)
	default:
	}
	per := make([]int64, len(after))
	for i := range after {
		per[i] = after[i].Load()
	}
	t.Logf("%d reloads: %d statements ran, %d refused (before the first reload, then after each: %v); status %+v",
		reloads, ran.Load(), refused.Load(), per, sharedStatusOf(t, p, "slots"))
	if n := refused.Load(); n > 0 {
		t.Errorf("an instance alone with at most %d of its 64 slots in flight was refused %d statements (of %d) across %d reloads of sync_interval; first: %v",
			workers, n, n+ran.Load(), reloads, firstRefusal.Load())
	}
}
