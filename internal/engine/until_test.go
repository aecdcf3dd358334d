package engine

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// A rule stops selecting at its until, with no reload, even for a text whose route is cached;
// a rule whose until has passed never applies.
func TestRuleUntil(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: block, mode: enforce, max_concurrent: 0}
rules:
  - {budget: block, match: {tenant: noisy}, until: 2026-01-01T00:01:00Z}
  - {budget: block, match: {tenant: old}, until: 2025-12-31T23:59:00Z}
`)
	noisy := tagging.With(context.Background(), "tenant", "noisy")
	until := time.Date(2026, 1, 1, 0, 1, 0, 0, time.UTC)
	for range 3 { // the second and third use the text's saved route
		// No wait admits it, but the rule lapses: its RetryAfter is the time left until then.
		if d := denial(t, run(e, clk, noisy, "select 1", 0)); d.Rule != "tenant=noisy" || d.RetryAfter != until.Sub(clk.Now()) {
			t.Fatalf("denial %+v; want rule tenant=noisy, retry after %v", d, until.Sub(clk.Now()))
		}
	}
	if err := run(e, clk, tagging.With(context.Background(), "tenant", "old"), "select 1", 0); err != nil {
		t.Fatalf("a lapsed rule applied: %v", err)
	}
	clk.Advance(59 * time.Second)
	if err := run(e, clk, noisy, "select 1", 0); err == nil {
		t.Fatal("admitted a second before the rule lapses")
	}
	clk.Advance(time.Second)
	if err := run(e, clk, noisy, "select 1", 0); err != nil {
		t.Fatalf("the rule applies at its until: %v", err)
	}
	if err := e.Check(noisy); err != nil {
		t.Fatalf("Check applies a lapsed rule: %v", err)
	}
	want := []RuleExpiry{
		{Rule: "tenant=noisy", Budget: "block", Until: time.Date(2026, 1, 1, 0, 1, 0, 0, time.UTC)},
		{Rule: "tenant=old", Budget: "block", Until: time.Date(2025, 12, 31, 23, 59, 0, 0, time.UTC)},
	}
	if got := e.RuleExpiries(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("RuleExpiries %+v", got)
	}
}

// A rules file whose every until has passed loads, with a warning.
func TestAllRulesLapsedWarns(t *testing.T) {
	var buf bytes.Buffer
	e, _ := newEngine(t, "", func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(&buf, nil)) })
	cfg, err := rules.Parse([]byte(`
budgets: [{name: b, max_concurrent: 0}]
rules: [{budget: b, match: {tenant: x}, until: 2025-06-01T00:00:00Z}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.setConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "level=WARN") || !strings.Contains(buf.String(), "lapsed") {
		t.Fatalf("log %q", buf.String())
	}
}

// A rules file with a rule whose until has passed beside live ones (an until written in local
// time, taken for UTC, in the past already) loads with a warning naming that rule.
func TestSomeRulesLapsedWarns(t *testing.T) {
	var buf bytes.Buffer
	e, _ := newEngine(t, "", func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(&buf, nil)) })
	cfg, err := rules.Parse([]byte(`
budgets: [{name: b, max_concurrent: 0}]
rules:
  - {budget: b, match: {tenant: y}}
  - {budget: b, match: {tenant: x}, until: 2025-06-01T00:00:00Z}
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.setConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "level=WARN") || !strings.Contains(buf.String(), "rules[1]") {
		t.Fatalf("log %q, want a warning naming rules[1]", buf.String())
	}
}
