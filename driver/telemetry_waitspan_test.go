package driver

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestWaitShowsInSpan: a statement that waited for capacity (max_wait) has a span that
// starts when it began waiting, as startSpan's doc says ("time spent on EXPLAIN or waiting for
// capacity (max_wait) shows in the caller's trace"), not when the wait ended.
func TestWaitShowsInSpan(t *testing.T) {
	h := newTelHarness(t, `
budgets:
  - name: w
    mode: enforce
    max_concurrent: 1
    max_wait: 1m
rules:
  - budget: w
    match: {app: r}
`)
	ctx := tagging.With(context.Background(), "app", "r")
	release := h.hold(t, ctx)
	waitBegan := h.clock.Now()
	done := make(chan error)
	go func() {
		_, err := h.db.ExecContext(tagging.With(ctx, "step", "waiter"), "UPDATE items SET a = 1 WHERE id = $1", 2)
		done <- err
	}()
	for h.conn.Snapshot().Budgets[0].Waiting == 0 {
		runtime.Gosched()
	}
	h.clock.Advance(3 * time.Second) // the waiter waits 3s for the slot
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, s := range h.spans.GetSpans() {
		if attrOf(s.Attributes, "pgtraffic.tag.step").AsString() != "waiter" {
			continue
		}
		if s.StartTime.After(waitBegan) {
			t.Fatalf("span of a statement that waited 3s for capacity starts at %v, %v after its wait began (%v): the wait is not in the trace",
				s.StartTime, s.StartTime.Sub(waitBegan), waitBegan)
		}
		return
	}
	t.Fatal("no span for the waiter")
}
