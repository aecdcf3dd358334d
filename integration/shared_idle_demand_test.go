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
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// openSharedPool opens a driver.NewPool (one instance) on dsn with rules.
func openSharedPool(t *testing.T, dsn, rules string, logs *lockedBuffer) *driver.Pool {
	t.Helper()
	cfg, err := driver.ParseConfig([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	p, err := driver.NewPool(context.Background(), dsn, driver.WithConfig(cfg), driver.WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func sharedStatusOf(t *testing.T, p *driver.Pool, name string) driver.SharedStatus {
	t.Helper()
	for _, b := range p.Snapshot().Budgets {
		if b.Name == name && b.Shared != nil {
			return *b.Shared
		}
	}
	t.Fatalf("no shared budget %q", name)
	return driver.SharedStatus{}
}

// TestSharedIdleInstanceKeepsNoSlot: two instances (two driver.NewPool) share
// max_concurrent: 2 (no per tag) at sync_interval 100ms. Instance A runs one statement and then
// nothing at all. A second later (ten intervals) instance B runs two workers back to back. The
// README ("Shared budgets") says slots are granted as "each instance its demand or an even
// split ... what no instance asks for is spread evenly as headroom", and "a statement is
// refused only once its instance grew past its share of the headroom since its last sync";
// doc.go ("Slots with headroom"): the demand is "the most statements that wanted a slot at
// once since its last sync, falling slowly". A, with nothing in flight or refused for ten
// intervals and more, asks for nothing, so B (whose demand of 2 has been steady for many
// syncs) should hold both slots and be refused nothing, as a process-local budget of 2 would.
func TestSharedIdleInstanceKeepsNoSlot(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	rules := fmt.Sprintf(`
coordination: {redis: %q, sync_interval: 100ms}
budgets:
  - {name: slots, mode: enforce, max_concurrent: 2}
rules:
  - {budget: slots, match: {app: fleet}}
`, srv.URL)
	var logs lockedBuffer
	a := openSharedPool(t, dsn, rules, &logs)
	b := openSharedPool(t, dsn, rules, &logs)
	ctx := tagging.With(context.Background(), "app", "fleet")
	if !eventually(5*time.Second, func() bool {
		return sharedStatusOf(t, a, "slots").Instances == 2 && sharedStatusOf(t, b, "slots").Instances == 2
	}) {
		t.Fatalf("the instances never saw each other: %+v %+v", sharedStatusOf(t, a, "slots"), sharedStatusOf(t, b, "slots"))
	}
	// A runs one statement, then stays idle for the rest of the test.
	if err := poolExecAdmitted(a, ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	idleSince := time.Now()
	time.Sleep(500 * time.Millisecond)

	// B: two workers back to back, from 0.5 s after A's last statement.
	var ran, refused atomic.Int64
	var counting atomic.Bool
	var mu sync.Mutex
	var errs []error
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := b.Exec(ctx, "select pg_sleep(0.05)")
				switch {
				case err == nil:
					if counting.Load() {
						ran.Add(1)
					}
				case errors.Is(err, driver.ErrBlocked):
					if counting.Load() {
						refused.Add(1)
					}
					time.Sleep(2 * time.Millisecond)
				default:
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	// Count from 1.2 s to 2.2 s after A's last statement: A has had nothing in flight for 12
	// to 22 intervals, B has wanted two slots for 7 intervals and more.
	time.Sleep(time.Until(idleSince.Add(1200 * time.Millisecond)))
	counting.Store(true)
	time.Sleep(time.Until(idleSince.Add(2200 * time.Millisecond)))
	counting.Store(false)
	sa, sb := sharedStatusOf(t, a, "slots"), sharedStatusOf(t, b, "slots")
	close(stop)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errs[0])
	}
	t.Logf("B, 1.2-2.2 s after A's last statement: %d ran, %d refused; A's lease %d slots, B's %d",
		ran.Load(), refused.Load(), sa.Slots, sb.Slots)
	if refused.Load() > 0 || sa.Slots > 0 {
		t.Errorf("A, idle for over ten sync intervals, still holds %d of the 2 slots; B, wanting 2 steadily, holds %d "+
			"and had %d of %d statements refused for concurrency with at most one in flight in the fleet",
			sa.Slots, sb.Slots, refused.Load(), ran.Load()+refused.Load())
	}
}

// poolExecAdmitted runs q on p, trying again for up to 5s while it is refused for concurrency.
func poolExecAdmitted(p *driver.Pool, ctx context.Context, q string) error {
	var err error
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		_, err = p.Exec(ctx, q)
		var be *driver.BlockedError
		if !errors.As(err, &be) || be.Reason != driver.ReasonConcurrency {
			return err
		}
	}
	return err
}
