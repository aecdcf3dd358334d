package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
	"github.com/pgtraffic/pgtraffic/internal/pattern"
	"github.com/pgtraffic/pgtraffic/tagging"
)

const quarantineRules = `
budgets:
  - {name: r, mode: enforce, max_duration: 300ms, per_query_limit: 10s, quarantine: {after: 2, for: 30s}}
rules:
  - {budget: r, match: {app: r}}
`

// overrun begins q and finishes it as cancelled past its max_duration.
func overrun(t *testing.T, e *Engine, clk *fakeclock.Clock, ctx context.Context, q string) {
	t.Helper()
	x, err := begin(e, ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(300 * time.Millisecond)
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
	clk.Advance(31 * time.Second) // the first strike leaves the window
	overrun(t, e, clk, ctx, slow)
	if err := run(e, clk, ctx, slow, 0); err != nil {
		t.Fatalf("quarantined after one strike in the window: %v", err)
	}
	overrun(t, e, clk, ctx, slow)
	d := denial(t, run(e, clk, ctx, slow, 0))
	if d.Reason != vocab.ReasonQuarantine || d.Budget != "r" || d.RetryAfter != 30*time.Second {
		t.Fatalf("denial %+v", d)
	}
	if err := run(e, clk, ctx, "select 1", 0); err != nil {
		t.Fatalf("another pattern: %v", err)
	}
	q := e.Quarantines()
	if len(q) != 1 || q[0].Budget != "r" || q[0].Fingerprint != d.Fingerprint || q[0].Query != "select pg_sleep($1)" ||
		!q[0].Until.Equal(clk.Now().Add(30*time.Second)) {
		t.Fatalf("Quarantines %+v", q)
	}
	clk.Advance(10 * time.Second)
	if d := denial(t, run(e, clk, ctx, slow, 0)); d.RetryAfter != 20*time.Second {
		t.Fatalf("RetryAfter %v, want 20s", d.RetryAfter)
	}
	clk.Advance(20 * time.Second)
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
		if err := e.setConfig(cfg); err != nil {
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
	if d := denial(t, run(e, clk, ctx, "select 2", 0)); d.Reason != vocab.ReasonQuarantine {
		t.Fatalf("denial %+v", d)
	}
}

// A shared budget's quarantine begun here is handed to its coordinator once, with its end;
// one handed back from Redis (another instance's) refuses the pattern here until it ends,
// shows in the status as another instance's with no text until the pattern is met, and
// leaves the budget's other patterns alone. Quarantines read under settings that are no
// longer the budget's, or that have ended, are ignored; a reload changing the settings lifts
// those learnt too.
func TestQuarantineShared(t *testing.T) {
	e, clk := newEngine(t, quarantineRules)
	ctx := tagging.With(context.Background(), "app", "r")
	type published struct {
		fp    uint64
		until time.Time
	}
	var pub []published
	e.quarantined.share("r", func(fp uint64, until time.Time) { pub = append(pub, published{fp, until}) })
	const slow, other = "select pg_sleep(5)", "select pg_sleep(6)::text"

	overrun(t, e, clk, ctx, slow)
	if len(pub) != 0 {
		t.Fatalf("published %v after one strike", pub)
	}
	overrun(t, e, clk, ctx, slow)
	fp := pattern.Analyze(slow)
	if len(pub) != 1 || pub[0].fp != fp.FingerprintID || !pub[0].until.Equal(clk.Now().Add(30*time.Second)) {
		t.Fatalf("published %v, want %x until now + 30s once", pub, fp.FingerprintID)
	}
	if q := e.Quarantines(); len(q) != 1 || q[0].Remote {
		t.Fatalf("Quarantines %+v, want this instance's own", q)
	}
	// Its own quarantine coming back from Redis a little later stays its own.
	settings := rules.Quarantine{After: 2, For: rules.Duration(30 * time.Second)}
	e.AddQuarantines(clk.Now(), "r", settings, []Quarantined{{Fingerprint: fp.FingerprintID, Until: clk.Now().Add(30*time.Second + time.Millisecond)}})
	if q := e.Quarantines(); len(q) != 1 || q[0].Remote {
		t.Fatalf("Quarantines %+v after its own came back", q)
	}

	// Another instance's, for a pattern never met here.
	op := pattern.Analyze(other)
	e.AddQuarantines(clk.Now(), "r", settings, []Quarantined{{Fingerprint: op.FingerprintID, Until: clk.Now().Add(20 * time.Second)}})
	// Ignored: other settings; ended.
	e.AddQuarantines(clk.Now(), "r", rules.Quarantine{After: 3, For: rules.Duration(30 * time.Second)},
		[]Quarantined{{Fingerprint: 7, Until: clk.Now().Add(10 * time.Second)}})
	e.AddQuarantines(clk.Now(), "r", settings, []Quarantined{{Fingerprint: 8, Until: clk.Now()}})
	q := e.Quarantines()
	if len(q) != 2 {
		t.Fatalf("Quarantines %+v, want this instance's and the other's", q)
	}
	for _, x := range q {
		if x.Fingerprint == op.Fingerprint && (!x.Remote || x.Query != "" || !x.Until.Equal(clk.Now().Add(20*time.Second))) {
			t.Fatalf("the other instance's quarantine listed as %+v", x)
		}
	}
	d := denial(t, run(e, clk, ctx, other, 0))
	if d.Reason != vocab.ReasonQuarantine || d.Fingerprint != op.Fingerprint || d.RetryAfter != 20*time.Second {
		t.Fatalf("denial %+v", d)
	}
	for _, x := range e.Quarantines() {
		if x.Fingerprint == op.Fingerprint && x.Query != "select pg_sleep($1)::text" {
			t.Errorf("after meeting the pattern its text is %q", x.Query)
		}
	}
	if err := run(e, clk, ctx, "select 1", 0); err != nil {
		t.Fatalf("another pattern of the budget: %v", err)
	}
	if len(pub) != 1 {
		t.Errorf("republished a quarantine learnt from Redis: %v", pub)
	}
	clk.Advance(20 * time.Second)
	if err := run(e, clk, ctx, other, 0); err != nil {
		t.Fatalf("after the other instance's quarantine ended: %v", err)
	}

	e.AddQuarantines(clk.Now(), "r", settings, []Quarantined{{Fingerprint: op.FingerprintID, Until: clk.Now().Add(20 * time.Second)}})
	cfg, err := rules.Parse([]byte(`
budgets:
  - {name: r, mode: enforce, max_duration: 300ms, quarantine: {after: 3, for: 30s}}
rules:
  - {budget: r, match: {app: r}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.setConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if q := e.Quarantines(); len(q) != 0 {
		t.Fatalf("a reload changing the settings left %+v", q)
	}
	e.AddQuarantines(clk.Now(), "r", settings, []Quarantined{{Fingerprint: op.FingerprintID, Until: clk.Now().Add(20 * time.Second)}})
	if q := e.Quarantines(); len(q) != 0 {
		t.Fatalf("a quarantine read under the old settings was taken: %+v", q)
	}
}
