package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	pgtdriver "github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// A quarantine ends when its for: ends; overruns further apart than for: never add up; a
// reload that changes only max_duration keeps a quarantine, one that changes its settings
// lifts it.
func TestOverrunQuarantineLifecycle(t *testing.T) {
	base := `
budgets:
  - {name: bounded, mode: enforce, max_duration: 200ms, quarantine: {after: 2, for: 2s}}
rules:
  - {budget: bounded, match: {app: reports}}
`
	c, db := openRules(t, base)
	ctx := tagging.With(context.Background(), "app", "reports")
	const slow = "select pg_sleep(5)"
	over := func(step string) {
		t.Helper()
		if _, err := db.ExecContext(ctx, slow); !errors.Is(err, pgtdriver.ErrOverrun) {
			t.Fatalf("%s: %v, want an overrun", step, err)
		}
	}
	// Two overruns 2.5s apart: the window (2s) holds one at a time.
	over("first")
	time.Sleep(2500 * time.Millisecond)
	over("second, out of the window")
	// Two within the window: quarantined, RetryAfter at most 2s.
	over("third, in the window")
	_, err := db.ExecContext(ctx, slow)
	be := asBlocked(t, err)
	if be.Reason != pgtdriver.ReasonQuarantine || be.RetryAfter <= 0 || be.RetryAfter > 2*time.Second {
		t.Fatalf("%+v", be)
	}
	// Lifted when for: ends.
	time.Sleep(be.RetryAfter + 100*time.Millisecond)
	if _, err := db.ExecContext(ctx, "select pg_sleep(0.01)"); err != nil {
		t.Fatalf("after for: ended: %v", err)
	}
	// The strikes were reset by the quarantine: one overrun does not quarantine again.
	over("after the quarantine")
	if _, err := db.ExecContext(ctx, "select pg_sleep(0.01)"); err != nil {
		t.Fatalf("one overrun after a quarantine refuses: %v", err)
	}
	// Quarantine again, then a reload changing max_duration only: kept.
	over("again")
	if _, err := db.ExecContext(ctx, slow); !errors.Is(err, pgtdriver.ErrBlocked) {
		t.Fatalf("want quarantined: %v", err)
	}
	setRulesOn(t, c, `
budgets:
  - {name: bounded, mode: enforce, max_duration: 250ms, quarantine: {after: 2, for: 2s}}
rules:
  - {budget: bounded, match: {app: reports}}
`)
	if _, err := db.ExecContext(ctx, slow); !errors.Is(err, pgtdriver.ErrBlocked) {
		t.Errorf("after a reload of max_duration only: %v, want still quarantined", err)
	}
	setRulesOn(t, c, `
budgets:
  - {name: bounded, mode: enforce, max_duration: 250ms, quarantine: {after: 3, for: 2s}}
rules:
  - {budget: bounded, match: {app: reports}}
`)
	if _, err := db.ExecContext(ctx, "select pg_sleep(0.01)"); err != nil {
		t.Errorf("after a reload changing after: %v, want lifted", err)
	}
	if qs := c.Snapshot().Quarantines; len(qs) != 0 {
		t.Errorf("status after the lift: %+v", qs)
	}
}
