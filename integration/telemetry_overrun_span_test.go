package integration

import (
	"context"
	"errors"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestOverrunSpanCarriesDecision: a statement that runs past its budget's max_duration is
// counted (pgtraffic.decisions, Snapshot, log) as a block (enforce: cancelled) or a warn (warn
// mode: let run), reason max_duration, when it ends. Its span, started before, says the same
// (warn budgets log, count and annotate the span: pgtraffic.decision and pgtraffic.reason, as
// the README's telemetry reference says), for both front ends.
func TestOverrunSpanCarriesDecision(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	const rules = `
budgets:
  - {name: cut, mode: enforce, max_duration: 150ms}
  - {name: watch, mode: warn, max_duration: 150ms}
rules:
  - {budget: cut, match: {app: cut}}
  - {budget: watch, match: {app: watch}}
`
	p, _ := openPool(t, rules, driver.WithTracerProvider(tp))
	s := newTelSetup(t, rules, driver.WithTracerProvider(tp))
	spans.Reset()

	cut := func(step string) context.Context {
		return tagging.With(context.Background(), "app", "cut", "step", step)
	}
	watch := func(step string) context.Context {
		return tagging.With(context.Background(), "app", "watch", "step", step)
	}
	if _, err := p.Exec(cut("pool-cut"), "select pg_sleep(2)"); !errors.Is(err, driver.ErrOverrun) {
		t.Fatalf("pool enforce overrun: %v, want ErrOverrun", err)
	}
	if _, err := s.db.ExecContext(cut("sql-cut"), "select pg_sleep(2)"); !errors.Is(err, driver.ErrOverrun) {
		t.Fatalf("database/sql enforce overrun: %v, want ErrOverrun", err)
	}
	if _, err := p.Exec(watch("pool-watch"), "select pg_sleep(0.4)"); err != nil {
		t.Fatalf("pool warn overrun must run: %v", err)
	}
	if _, err := s.db.ExecContext(watch("sql-watch"), "select pg_sleep(0.4)"); err != nil {
		t.Fatalf("database/sql warn overrun must run: %v", err)
	}

	// What the counts say (the same for both front ends).
	for _, b := range p.Snapshot().Budgets {
		switch b.Name {
		case "cut":
			if b.BlockedBy["max_duration"] != 1 {
				t.Fatalf("pool: cut blocked_by %v, want max_duration: 1", b.BlockedBy)
			}
		case "watch":
			if b.WarnedBy["max_duration"] != 1 {
				t.Fatalf("pool: watch warned_by %v, want max_duration: 1", b.WarnedBy)
			}
		}
	}

	got := spans.GetSpans()
	for _, step := range []string{"pool-cut", "sql-cut"} {
		sp := telSpan(t, got, step)
		if d, r := telAttr(sp.Attributes, "pgtraffic.decision").AsString(), telAttr(sp.Attributes, "pgtraffic.reason").AsString(); d != "block" || r != "max_duration" {
			t.Errorf("%s: span pgtraffic.decision=%q pgtraffic.reason=%q, want block/max_duration (as pgtraffic.decisions and the Snapshot count it)", step, d, r)
		}
	}
	for _, step := range []string{"pool-watch", "sql-watch"} {
		sp := telSpan(t, got, step)
		d, r := telAttr(sp.Attributes, "pgtraffic.decision").AsString(), telAttr(sp.Attributes, "pgtraffic.reason").AsString()
		event := false
		for _, e := range sp.Events {
			if e.Name == "pgtraffic.warn" && telAttr(e.Attributes, "pgtraffic.reason").AsString() == "max_duration" {
				event = true
			}
		}
		if d != "warn" || r != "max_duration" || !event {
			t.Errorf("%s: span pgtraffic.decision=%q pgtraffic.reason=%q, pgtraffic.warn event with reason max_duration: %v; want warn/max_duration and the event (as the metric, the Snapshot and the log say)", step, d, r, event)
		}
	}
}
