package integration

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// sleepyWarnHandler takes d over each WARN record (a log shipper that blocks).
type sleepyWarnHandler struct{ d time.Duration }

func (h sleepyWarnHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h sleepyWarnHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h sleepyWarnHandler) WithGroup(string) slog.Handler            { return h }
func (h sleepyWarnHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		time.Sleep(h.d)
	}
	return nil
}

// TestUsercodeSlowWarnLogChargedAsCost: the README (Server seconds) says that without the
// server's clock a statement is charged "the time from send until the statement ends", and the
// engine restarts a statement's clock after an EXPLAIN or a wait, which are "not the statement's
// cost". A warn-mode budget's warning is logged through the application's logger
// (engine.warnBudgets, after the enforce budgets admitted the statement, before it is sent),
// and the time the application's handler takes over that WARN record is charged to the enforce
// budget's bucket as if the server had spent it: here one `select 1` whose warning took 2 s to
// log leaves the enforce budget about 2 s in debt, which later statements pay for.
func TestUsercodeSlowWarnLogChargedAsCost(t *testing.T) {
	const stall = 2 * time.Second
	c, db := openRules(t, `
budgets:
  - {name: share, mode: enforce, server_share: 0.01, burst_limit: 20s}
  - {name: watch, mode: warn, max_concurrent: 0}
rules:
  - {budget: share, match: {app: r}}
  - {budget: watch, match: {app: r}}
`, driver.WithLogger(slog.New(sleepyWarnHandler{d: stall})))
	ctx := tagging.With(context.Background(), "app", "r")
	// The first statement of the pattern is explained (its clock restarts after that); the
	// second is priced from the cached plan.
	if _, err := db.ExecContext(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	before := budgetStatus(t, c, "share").Debt
	time.Sleep(1100 * time.Millisecond) // past the warning log's rate limit (a line a second)
	t0 := time.Now()
	if _, err := db.ExecContext(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	debt := budgetStatus(t, c, "share").Debt - before
	t.Logf("select 1 returned after %v (of which the WARN handler %v); the enforce budget's debt grew by %.3f s", took, stall, debt)
	if debt > stall.Seconds()/2 {
		t.Fatalf("the enforce budget was charged %.3f s for a `select 1` whose warning the application's "+
			"handler took %v to log: the handler's time is not the statement's cost", debt, stall)
	}
}
