package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	pgtdriver "github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// A reload that relaxes a budget's quarantine (after: 1, for: 1h -> after: 5, for: 10s) while a
// statement admitted under the old settings is running: that statement overruns after the
// reload. The README / rules doc: "A reload that changes a budget's quarantine lifts its
// quarantines"; under the new settings one overrun quarantines nothing, and no quarantine may
// last past the new for: (10s). The pattern must not be refused for an hour.
func TestOverrunQuarantineReloadInFlight(t *testing.T) {
	strict := `
budgets:
  - {name: bounded, mode: enforce, max_duration: 800ms, quarantine: {after: 1, for: 1h}}
rules:
  - {budget: bounded, match: {app: reports}}
`
	relaxed := `
budgets:
  - {name: bounded, mode: enforce, max_duration: 800ms, quarantine: {after: 5, for: 10s}}
rules:
  - {budget: bounded, match: {app: reports}}
`
	c, db := openRules(t, strict)
	ctx := tagging.With(context.Background(), "app", "reports")
	done := make(chan error, 1)
	go func() {
		_, err := db.ExecContext(ctx, "select pg_sleep(5)")
		done <- err
	}()
	// Reload once the statement is admitted and running.
	if !eventually(5*time.Second, func() bool { return budgetStatus(t, c, "bounded").InFlight == 1 }) {
		t.Fatal("the statement never started")
	}
	time.Sleep(100 * time.Millisecond)
	setRulesOn(t, c, relaxed)
	err := <-done
	if !errors.Is(err, pgtdriver.ErrOverrun) {
		t.Fatalf("in-flight statement: %v, want an overrun", err)
	}
	t.Logf("quarantines after the overrun: %+v", c.Snapshot().Quarantines)
	_, err = db.ExecContext(ctx, "select pg_sleep(0.01)")
	var be *pgtdriver.BlockedError
	if errors.As(err, &be) {
		t.Errorf("after a reload to quarantine {after: 5, for: 10s}, one overrun refuses the pattern: reason %s, RetryAfter %v, limit %q",
			be.Reason, be.RetryAfter, be.Limit)
		if be.RetryAfter > 10*time.Second {
			t.Errorf("quarantined for %v, beyond the budget's for: 10s", be.RetryAfter)
		}
	} else if err != nil {
		t.Fatalf("the pattern after the reload: %v", err)
	}
	for _, q := range c.Snapshot().Quarantines {
		if time.Until(q.Until) > 10*time.Second {
			t.Errorf("status lists a quarantine until %v (%v left), beyond the budget's for: 10s", q.Until, time.Until(q.Until).Round(time.Second))
		}
	}
}

// The same with the quarantine removed by the reload and then put back with other settings: no
// quarantine of the old settings may come back.
func TestOverrunQuarantineRemovedInFlight(t *testing.T) {
	strict := `
budgets:
  - {name: bounded, mode: enforce, max_duration: 800ms, quarantine: {after: 1, for: 1h}}
rules:
  - {budget: bounded, match: {app: reports}}
`
	none := `
budgets:
  - {name: bounded, mode: enforce, max_duration: 800ms}
rules:
  - {budget: bounded, match: {app: reports}}
`
	c, db := openRules(t, strict)
	ctx := tagging.With(context.Background(), "app", "reports")
	done := make(chan error, 1)
	go func() {
		_, err := db.ExecContext(ctx, "select pg_sleep(5)")
		done <- err
	}()
	if !eventually(5*time.Second, func() bool { return budgetStatus(t, c, "bounded").InFlight == 1 }) {
		t.Fatal("the statement never started")
	}
	time.Sleep(100 * time.Millisecond)
	setRulesOn(t, c, none)
	if err := <-done; !errors.Is(err, pgtdriver.ErrOverrun) {
		t.Fatalf("in-flight statement: %v, want an overrun", err)
	}
	if qs := c.Snapshot().Quarantines; len(qs) != 0 {
		t.Errorf("a budget without quarantine lists quarantines: %+v", qs)
	}
	if _, err := db.ExecContext(ctx, "select pg_sleep(0.01)"); err != nil {
		t.Fatalf("budget without quarantine: %v", err)
	}
}
