package driver

import (
	"context"
	"runtime"
	"testing"

	"go.opentelemetry.io/otel/codes"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestCancelledWaitSpanIsBlocked: a statement whose context ends while it waits for capacity
// (max_wait) is never sent. Its span has error status and is its budget's block, for what it
// waited for: the budget kept it out until its caller gave up, and an operator watching
// refusals must see it (it is not allowed, as it never ran).
func TestCancelledWaitSpanIsBlocked(t *testing.T) {
	h := newTelHarness(t, `
budgets:
  - name: w
    mode: enforce
    max_concurrent: 1
    max_wait: 10s
rules:
  - budget: w
    match: {app: r}
`)
	ctx := tagging.With(context.Background(), "app", "r")
	release := h.hold(t, ctx)
	defer release()
	cctx, cancel := context.WithCancel(tagging.With(ctx, "step", "waiter"))
	done := make(chan error)
	go func() {
		rows, err := h.db.QueryContext(cctx, "SELECT id FROM items WHERE id = $1", 2)
		if err == nil {
			err = rows.Close()
		}
		done <- err
	}()
	for h.conn.Snapshot().Budgets[0].Waiting == 0 {
		runtime.Gosched()
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the cancelled waiter ran")
	}
	for _, s := range h.spans.GetSpans() {
		if attrOf(s.Attributes, "pgtraffic.tag.step").AsString() != "waiter" {
			continue
		}
		if s.Status.Code != codes.Error {
			t.Errorf("status %v %q, want an error", s.Status.Code, s.Status.Description)
		}
		for key, want := range map[string]string{"pgtraffic.decision": "block", "pgtraffic.reason": "concurrency",
			"pgtraffic.budget": "w"} {
			if got := attrOf(s.Attributes, key).AsString(); got != want {
				t.Errorf("span of a statement kept out until its context ended: %s=%q, want %q", key, got, want)
			}
		}
		return
	}
	t.Fatal("no span for the cancelled waiter")
}
