package integration

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// stallingHandler is an application's slog handler that stalls on a WARN record (a log shipper
// whose buffer is full, a handler that writes to a slow disk) until release is closed.
type stallingHandler struct {
	release chan struct{}
	once    *sync.Once
	mu      *sync.Mutex
	stalled *int // WARN records that stalled
}

func newStallingHandler() stallingHandler {
	n := 0
	return stallingHandler{release: make(chan struct{}), once: &sync.Once{}, mu: &sync.Mutex{}, stalled: &n}
}

func (h stallingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h stallingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h stallingHandler) WithGroup(string) slog.Handler            { return h }
func (h stallingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn || !strings.Contains(r.Message, "blocked") {
		return nil
	}
	h.mu.Lock()
	*h.stalled++
	h.mu.Unlock()
	select {
	case <-h.release:
	case <-time.After(30 * time.Second):
	}
	return nil
}

func (h stallingHandler) unstall() { h.once.Do(func() { close(h.release) }) }

func (h stallingHandler) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return *h.stalled
}

// TestUsercodeSlowLoggerHoldsTheQueue: the README promises that under max_wait "waiting
// statements are admitted in arrival order, the moment a slot is released" (README, Rolling
// out a budget, step 3), and that a waiter "whose context ends while it waits returns the
// context's error and counts as its budget's refusal" (How a statement is decided, Admit).
//
// A waiter whose context ends is refused and logged through the application's logger
// (WithLogger) while it is still first in the budget's queue: engine.await calls refuse (and so
// the slog handler) before its deferred c.leave. With a handler that takes its time on the WARN
// record, the statement behind it is held up by the queue's first place, which nobody holds
// any more: the slot is released, but the second waiter is not admitted until the handler
// returns (here, it waits out its whole max_wait and is refused).
func TestUsercodeSlowLoggerHoldsTheQueue(t *testing.T) {
	const rules = `
budgets:
  - {name: reports, mode: enforce, max_concurrent: 1, max_wait: 4s, max_queue: 4}
rules:
  - {budget: reports, match: {app: reports}}
`
	type frontEnd struct {
		exec   func(ctx context.Context, q string) error
		status func() driver.BudgetStatus
	}
	for _, fe := range []string{"pool", "database/sql"} {
		t.Run(strings.ReplaceAll(fe, "/", "_"), func(t *testing.T) {
			h := newStallingHandler()
			defer h.unstall()
			var f frontEnd
			if fe == "pool" {
				p, _ := openPool(t, rules, driver.WithLogger(slog.New(h)))
				f.exec = func(ctx context.Context, q string) error { _, err := p.Exec(ctx, q); return err }
				f.status = func() driver.BudgetStatus { return poolBudget(t, p, "reports") }
			} else {
				c, db := openRules(t, rules, driver.WithLogger(slog.New(h)))
				db.SetMaxOpenConns(8)
				db.SetMaxIdleConns(8)
				f.exec = func(ctx context.Context, q string) error { _, err := db.ExecContext(ctx, q); return err }
				f.status = func() driver.BudgetStatus { return budgetStatus(t, c, "reports") }
			}
			ctx := tagging.With(context.Background(), "app", "reports")
			if err := f.exec(ctx, "select 1"); err != nil { // warm: connection, pattern
				t.Fatal(err)
			}

			// H holds the only slot for a second.
			held := make(chan error, 1)
			go func() { held <- f.exec(ctx, "select pg_sleep(1)") }()
			mustEventually(t, "one statement in flight", func() bool { return f.status().InFlight == 1 })

			// A waits, first in the queue, under a request deadline.
			actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			aerr := make(chan error, 1)
			go func() { aerr <- f.exec(actx, "select 2") }()
			mustEventually(t, "one waiting", func() bool { return f.status().Waiting == 1 })

			// B waits behind A, with max_wait (4 s) to spare: H ends well before.
			berr := make(chan error, 1)
			bstart := time.Now()
			go func() { berr <- f.exec(ctx, "select 3") }()
			mustEventually(t, "two waiting", func() bool { return f.status().Waiting == 2 })

			if err := <-held; err != nil {
				t.Fatal(err)
			}
			var err error
			select {
			case err = <-berr:
			case <-time.After(10 * time.Second):
				h.unstall()
				err = <-berr
			}
			h.unstall()
			if e := <-aerr; !errors.Is(e, context.DeadlineExceeded) {
				t.Fatalf("A, whose context ended while it waited: %v", e)
			}
			t.Logf("%s: B returned after %v: %v (WARN records stalled in the handler: %d)", fe,
				time.Since(bstart).Round(time.Millisecond), err, h.count())
			if err != nil {
				t.Fatalf("B waited behind A, whose context ended while the slot was held, and was not admitted "+
					"when H released the slot (about 1 s, max_wait 4 s): %v; A's refusal was being logged "+
					"while A still held the first place in the queue", err)
			}
		})
	}
}
