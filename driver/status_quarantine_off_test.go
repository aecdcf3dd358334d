package driver

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestQuarantineOfBudgetTurnedOff: a pattern measured above per_query_limit is
// quarantined by its enforce budget (quarantine: {after: 1, for: 1h}); during the incident the
// operator turns the budget off (mode: off: "ignored", design section 2). The statement now
// runs, nothing refuses it. Snapshot's doc says Quarantines are "the patterns that a budget
// refuses for a while (reason quarantine)", and the status page lists them under "Quarantined
// patterns": a pattern its budget no longer refuses must not be listed there. Today the
// Snapshot and the page still show it as quarantined until the hour is out.
func TestQuarantineOfBudgetTurnedOff(t *testing.T) {
	const rulesFmt = `
budgets:
  - name: reports
    mode: %s
    per_query_limit: 1s
    quarantine: {after: 1, for: 1h}
rules:
  - budget: reports
    match: {app: reports}
`
	h := newTelHarness(t, strings.Replace(rulesFmt, "%s", "enforce", 1))
	ctx := tagging.With(context.Background(), "app", "reports")
	const q = "SELECT id FROM orders WHERE id = $1"
	rows, err := h.db.QueryContext(ctx, q, 1)
	if err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(5 * time.Second) // it ran 5 s, above the 1 s per_query_limit: a strike
	rows.Close()
	if _, err := h.db.ExecContext(ctx, q, 2); !errors.Is(err, ErrBlocked) {
		t.Fatalf("want the pattern quarantined, got %v", err)
	}
	if n := len(h.conn.Snapshot().Quarantines); n != 1 {
		t.Fatalf("%d quarantines before the reload, want 1", n)
	}

	cfg, err := ParseConfig([]byte(strings.Replace(rulesFmt, "%s", `"off"`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.rt.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := h.db.ExecContext(ctx, q, 3); err != nil {
		t.Fatalf("budget off: the statement should run, got %v", err)
	}
	s := h.conn.Snapshot()
	if len(s.Quarantines) != 0 {
		t.Errorf("the budget is off and the statement runs, yet Snapshot.Quarantines lists %+v", s.Quarantines)
	}
	resp := statusGet(t, h.conn.Handler(), http.MethodGet, "/", "")
	body, _ := io.ReadAll(resp.Body)
	page := string(body)
	i := strings.Index(page, `<table id="quarantines">`)
	j := strings.Index(page[i:], "</table>")
	if section := page[i : i+j]; strings.Contains(section, "SELECT id FROM orders") {
		t.Errorf("the status page lists the pattern as quarantined although its budget is off:\n%s", section)
	}
}
