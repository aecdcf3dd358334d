package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestOverrunOnRowsClose: a query whose first row arrives at once but whose rest
// takes seconds, read one row and closed early (a common "peek" pattern). The close drains the
// rows until max_duration cancels the statement on the server: that is an overrun, so Close's
// error must match driver.ErrOverrun, the budget must count it (blocked_by max_duration), and
// after quarantine.after such overruns the pattern must be quarantined.
func TestOverrunOnRowsClose(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: reports, mode: enforce, max_duration: 300ms, quarantine: {after: 2, for: 30s}}
rules:
  - {budget: reports, match: {app: reports}}
`)
	ctx := tagging.With(context.Background(), "app", "reports")
	// 64 kB rows are sent as they are made: the first arrives at once, the third after 2 s.
	const q = `select repeat('x', 65536), pg_sleep(case when g < 3 then 0 else 2 end) from generate_series(1, 4) g`
	for i := range 2 {
		t0 := time.Now()
		rows, err := db.QueryContext(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if !rows.Next() {
			t.Fatalf("no first row: %v", rows.Err())
		}
		cerr := rows.Close()
		took := time.Since(t0)
		if took > 1500*time.Millisecond {
			t.Fatalf("close returned after %v: max_duration did not cut the statement", took)
		}
		if !errors.Is(cerr, driver.ErrOverrun) {
			t.Errorf("round %d: rows.Close() = %v (after %v), want an error matching driver.ErrOverrun", i, cerr, took)
		}
	}
	if n := budgetStatus(t, c, "reports").BlockedBy[driver.ReasonMaxDuration]; n != 2 {
		t.Errorf("budget counted %d max_duration overruns, want 2", n)
	}
	rows, err := db.QueryContext(ctx, q)
	if err == nil {
		rows.Close()
		t.Fatalf("third run of a pattern that overran twice was admitted, want reason quarantine")
	}
	if be := asBlocked(t, err); be.Reason != driver.ReasonQuarantine {
		t.Fatalf("%+v", be)
	}
}
