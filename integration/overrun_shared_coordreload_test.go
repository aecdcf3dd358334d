package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	pgtdriver "github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// A reload that changes only the coordination section (here its sync_interval) replaces the
// instance's coordinator: the budgets it shares must go on sharing their quarantines. A's
// pattern quarantined after that reload must reach B, which shares the budget, as one
// quarantined before it would: B refuses the pattern, which never ran past its bound there.
func TestOverrunSharedQuarantineAfterCoordinationReload(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	mk := func(interval string) string {
		return fmt.Sprintf(`
coordination: {redis: %q, sync_interval: %s}
budgets:
  - {name: cq, mode: enforce, max_duration: 200ms, quarantine: {after: 1, for: 1h}}
rules:
  - {budget: cq, match: {app: reports}}
`, srv.URL, interval)
	}
	var logs lockedBuffer
	ca, dbA := openShared(t, dsn, mk("100ms"), &logs)
	_, dbB := openShared(t, dsn, mk("100ms"), &logs)
	setRulesOn(t, ca, mk("150ms")) // A's coordinator is replaced
	ctx := tagging.With(context.Background(), "app", "reports")
	if _, err := dbA.ExecContext(ctx, "select pg_sleep(2)"); !errors.Is(err, pgtdriver.ErrOverrun) {
		t.Fatalf("A's statement past max_duration: %v, want ErrOverrun", err)
	}
	var be *pgtdriver.BlockedError
	if _, err := dbA.ExecContext(ctx, "select pg_sleep(2)"); !errors.As(err, &be) || be.Reason != vocab.ReasonQuarantine {
		t.Fatalf("A after its overrun: %v, want its quarantine", err)
	}
	quarantined := eventually(5*time.Second, func() bool {
		be = nil
		_, err := dbB.ExecContext(ctx, "select pg_sleep(0.01)") // A's pattern, never past B's bound
		if err == nil {
			time.Sleep(50 * time.Millisecond)
		}
		return errors.As(err, &be) && be.Reason == vocab.ReasonQuarantine
	})
	if !quarantined {
		t.Fatalf("B never learned A's quarantine (shared through Redis) after A's coordination reload: last %v", be)
	}
}
