package driver

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/codes"

	"github.com/pgtraffic/pgtraffic/internal/engine"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestOvertakenPoolStatementSpanSaysBlock: a pool statement admitted before its
// connection whose slot a statement on a held connection overtook, and which is then refused
// once it has its connection (Acquired), was blocked: its span must say
// pgtraffic.decision=block, with pgtraffic.budget and pgtraffic.reason, as every other refused
// statement's span does (and as the decisions metric counts it).
func TestOvertakenPoolStatementSpanSaysBlock(t *testing.T) {
	h := newTelHarness(t, `
budgets:
  - name: b
    mode: enforce
    max_concurrent: 1
rules:
  - budget: b
    match: {app: x}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	const q = "SELECT id FROM items WHERE id = $1"

	// The pool statement: admitted before its connection, its slot pending.
	pending := new(engine.Exec)
	pctx, err := h.eng.BeginBeforeConn(tagging.With(ctx, "step", "pending"), pending, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A statement on a held connection (a transaction's) overtakes the pending slot.
	held := new(engine.Exec)
	hctx, err := h.eng.Begin(tagging.With(ctx, "step", "held"), held, nil, q, nil)
	if err != nil {
		t.Fatalf("the held connection's statement was held up by a pending slot: %v", err)
	}
	defer held.Finish(hctx, nil)

	// The pool statement gets its connection: the slot is gone and it is refused.
	err = pending.Acquired(pctx)
	var d *engine.Denial
	if !errors.As(err, &d) {
		t.Fatalf("Acquired = %v, want a denial (the only slot is taken)", err)
	}
	pending.Abandon(pctx, err)

	for _, s := range h.spans.GetSpans() {
		if attrOf(s.Attributes, "pgtraffic.tag.step").AsString() != "pending" {
			continue
		}
		if s.Status.Code != codes.Error {
			t.Errorf("status %v, want error", s.Status.Code)
		}
		for k, want := range map[string]string{
			"pgtraffic.decision": "block",
			"pgtraffic.reason":   "concurrency",
			"pgtraffic.budget":   "b",
			"error.type":         "pgtraffic.blocked",
		} {
			if got := attrOf(s.Attributes, k).String(); got != want {
				t.Errorf("span of the refused statement: %s = %q, want %q", k, got, want)
			}
		}
		return
	}
	t.Fatalf("no span for the refused pool statement (spans: %v)", spanNames(h.spans.GetSpans()))
}
