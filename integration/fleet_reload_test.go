package integration

import (
	"context"
	"database/sql"
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

// TestFleetReloadAddingCoordinationRefusesNothing: one instance runs 8 workers of
// `select 1` under a process-local budget of max_concurrent 64, and a reload adds a
// coordination section (a healthy Redis), as a team turning shared budgets on for a running
// service would. The instance is alone: the README ("Shared budgets") says that one instance
// alone refuses nothing the same budget process-local would admit, and that a budget made
// shared by a reload keeps its own limits until its first lease; a budget's state (debt,
// in-flight counts) survives a reload that keeps its name. No statement may be refused across
// the reload, neither before the coordinator's first sync answers nor after.
func TestFleetReloadAddingCoordinationRefusesNothing(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	const local = `
budgets:
  - {name: slots, mode: enforce, max_concurrent: 64}
rules:
  - {budget: slots, match: {app: fleet}}
`
	var logs lockedBuffer
	c, db := openShared(t, dsn, local, &logs)
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	w := startWorkers(t, db, 8)
	time.Sleep(time.Second) // the pool warm, every worker running
	if n := w.refused.Load(); n != 0 {
		w.stop()
		t.Fatalf("the process-local budget refused %d statements: the scenario is wrong", n)
	}
	cfg, err := driver.ParseConfig([]byte(fmt.Sprintf("coordination: {redis: %q, sync_interval: 1s}\n", srv.URL) + local))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	w.stop()
	s := sharedStatus(t, c, "slots")
	t.Logf("8 workers across a reload adding coordination: %d ran, %d refused; lease now %+v", w.ran.Load(), w.refused.Load(), s)
	if w.refused.Load() > 0 {
		t.Errorf("one instance alone, 8 in flight of a max_concurrent of 64: %d statements refused across the reload "+
			"that made the budget shared (first: %v)", w.refused.Load(), w.first())
	}
}

// workers run `select 1` tagged app=fleet on db in a loop until stop, counting what ran and
// what was refused (a refused worker pauses a millisecond).
type workers struct {
	ran, refused atomic.Int64
	mu           sync.Mutex
	firstErr     error
	cancel       context.CancelFunc
	wg           sync.WaitGroup
}

func startWorkers(t *testing.T, db *sql.DB, n int) *workers {
	w := &workers{}
	tagged := tagging.With(context.Background(), "app", "fleet")
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	for range n {
		w.wg.Go(func() {
			for ctx.Err() == nil {
				_, err := db.ExecContext(tagged, "select 1")
				switch {
				case err == nil:
					w.ran.Add(1)
				case errors.Is(err, driver.ErrBlocked):
					if w.refused.Add(1) == 1 {
						w.mu.Lock()
						w.firstErr = err
						w.mu.Unlock()
					}
					time.Sleep(time.Millisecond)
				default:
					t.Error(err)
					return
				}
			}
		})
	}
	t.Cleanup(w.stop)
	return w
}

// stop stops the workers and waits for them.
func (w *workers) stop() {
	w.cancel()
	w.wg.Wait()
}

// first is the first refusal.
func (w *workers) first() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.firstErr
}
