package integration

import (
	"context"
	"errors"
	"strings"
	"testing"

	pgtdriver "github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestOverrunErrorNamesBound: a statement refused by a budget gets an error naming the
// budget, the reason and the limit (pgtraffic: statement blocked by budget "bounded" (reason
// quarantine, ...)); a statement cancelled by a budget's max_duration is that budget's block
// too (status and metric: blocked, reason max_duration; the log line names budget=... and
// limit="max_duration=300ms"). With several budgets selecting a statement "the smallest bound
// applies", and a probe runs with a per_query_limit as its bound (README), so the caller's
// error is the only place an application can tell which budget and which bound cut its
// statement: it must name them, as the refusal's error does, and the log line does.
//
// An error saying only "pgtraffic: statement ran past its budget's max_duration and was
// cancelled: timeout: context deadline exceeded" would name neither.
func TestOverrunErrorNamesBound(t *testing.T) {
	_, db := openRules(t, `
budgets:
  - {name: everything, mode: enforce, max_duration: 30s}
  - {name: bounded, mode: enforce, max_duration: 300ms}
rules:
  - {budget: everything, match: {app: reports}}
  - {budget: bounded, match: {app: reports}}
`)
	ctx := tagging.With(context.Background(), "app", "reports")
	_, err := db.ExecContext(ctx, "select pg_sleep(5)")
	if !errors.Is(err, pgtdriver.ErrOverrun) {
		t.Fatalf("error %v, want an overrun", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, `"bounded"`) || !strings.Contains(msg, "300ms") {
		t.Errorf("overrun error %q does not name both the budget that cut the statement (bounded) and its bound (300ms)", msg)
	}
}
