package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/tagging"
)

const quarantineRules = `
budgets:
  - {name: r, mode: enforce, max_duration: 300ms, per_query_limit: 10s, quarantine: {after: 2, for: 30s}}
rules:
  - {budget: r, match: {app: r}}
`

// overrun begins q and finishes it as cancelled past its max_duration.
func overrun(t *testing.T, e *Engine, clk *clock, ctx context.Context, q string) {
	t.Helper()
	x, err := begin(e, ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	clk.advance(300 * time.Millisecond)
	x.Finish(ctx, fmt.Errorf("timeout: %w", ErrOverrun))
}

// A pattern that overran twice within the window is refused for the window, with the time left
// as RetryAfter; other patterns of the budget run; the status lists it; it lapses by itself;
// a reload that changes the budget's quarantine lifts it.
func TestQuarantine(t *testing.T) {
	e, clk := newEngine(t, quarantineRules)
	ctx := tagging.With(context.Background(), "app", "r")
	const slow = "select pg_sleep(5)"

	overrun(t, e, clk, ctx, slow)
	clk.advance(31 * time.Second) // the first strike leaves the window
	overrun(t, e, clk, ctx, slow)
	if err := run(e, clk, ctx, slow, 0); err != nil {
		t.Fatalf("quarantined after one strike in the window: %v", err)
	}
	overrun(t, e, clk, ctx, slow)
	d := denial(t, run(e, clk, ctx, slow, 0))
	if d.Reason != ReasonQuarantine || d.Budget != "r" || d.RetryAfter != 30*time.Second {
		t.Fatalf("denial %+v", d)
	}
	if err := run(e, clk, ctx, "select 1", 0); err != nil {
		t.Fatalf("another pattern: %v", err)
	}
	q := e.Quarantines()
	if len(q) != 1 || q[0].Budget != "r" || q[0].Fingerprint != d.Fingerprint || q[0].Query != "select pg_sleep($1)" ||
		!q[0].Until.Equal(clk.now().Add(30*time.Second)) {
		t.Fatalf("Quarantines %+v", q)
	}
	clk.advance(10 * time.Second)
	if d := denial(t, run(e, clk, ctx, slow, 0)); d.RetryAfter != 20*time.Second {
		t.Fatalf("RetryAfter %v, want 20s", d.RetryAfter)
	}
	clk.advance(20 * time.Second)
	if err := run(e, clk, ctx, slow, 0); err != nil || len(e.Quarantines()) != 0 {
		t.Fatalf("after the window: %v, %v", err, e.Quarantines())
	}

	// A reload keeping the settings keeps the quarantine; one changing them lifts it.
	overrun(t, e, clk, ctx, slow)
	overrun(t, e, clk, ctx, slow)
	reload := func(text string) {
		cfg, err := rules.Parse([]byte(text))
		if err != nil {
			t.Fatal(err)
		}
		if err := e.SetConfig(cfg); err != nil {
			t.Fatal(err)
		}
	}
	reload(quarantineRules)
	if len(e.Quarantines()) != 1 {
		t.Fatal("a reload with the same settings lifted the quarantine")
	}
	reload(`
budgets:
  - {name: r, mode: enforce, max_duration: 300ms, quarantine: {after: 3, for: 30s}}
rules:
  - {budget: r, match: {app: r}}
`)
	if err := run(e, clk, ctx, slow, 0); err != nil || len(e.Quarantines()) != 0 {
		t.Fatalf("after a reload changing the quarantine: %v, %v", err, e.Quarantines())
	}
}

// A statement measured above per_query_limit strikes as an overrun does.
func TestQuarantinePerQueryLimit(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: r, mode: enforce, per_query_limit: 1s, quarantine: {after: 1, for: 1m}}
rules:
  - {budget: r, match: {app: r}}
`)
	ctx := tagging.With(context.Background(), "app", "r")
	if err := run(e, clk, ctx, "select 2", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := denial(t, run(e, clk, ctx, "select 2", 0)); d.Reason != ReasonQuarantine {
		t.Fatalf("denial %+v", d)
	}
}
