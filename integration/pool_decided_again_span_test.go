package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// A pool statement admitted before its connection is decided again once it has one when the
// rules were replaced meanwhile (README: "decided again once it has its connection ..., and so
// is one whose rules were replaced meanwhile"). That is one statement, one call of the
// application's: its trace must show one span, ended once, with the statement's outcome, and
// the duration metric one sample. A span ended with an error status for a statement that then
// ran looks, in the caller's trace, like a failed query.

// TestPoolDecidedAgainOneSpan: the rules are replaced while the statement (or a batch of two)
// waits for the pool's one connection; once it has the connection it is decided again under
// the new rules, admitted, and runs. Then also when it waits in its re-admission on the
// connection (overtaken), and when the new rules refuse it.
func TestPoolDecidedAgainOneSpan(t *testing.T) {
	const start = `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 30s}]
rules: [{budget: b, match: {app: x}}]`
	const raised = `budgets: [{name: b, mode: enforce, max_concurrent: 5, max_wait: 30s}]
rules: [{budget: b, match: {app: x}}]`
	const closed = `budgets: [{name: b, mode: enforce, max_concurrent: 0}]
rules: [{budget: b, match: {app: x}}]`
	for _, batch := range []bool{false, true} {
		n := 1
		if batch {
			n = 2
		}
		t.Run(fmt.Sprintf("waiting for the pool, batch %v", batch), func(t *testing.T) {
			spans, out := runReloadedBeforeConn(t, start, raised, batch)
			if out != nil {
				t.Fatalf("the statement decided again under raised limits: %v", out)
			}
			wantOneSpanEach(t, spans, n, "")
		})
		t.Run(fmt.Sprintf("overtaken, waiting on its connection, batch %v", batch), func(t *testing.T) {
			d, out := runOvertaken(t, start, batch, 0, func(f *talliedEnd) { f.setConfig(t, raised) })
			if out != nil {
				t.Fatalf("the statement decided again under raised limits: %v", out)
			}
			// The overtaking query's span, and one per overtaken statement.
			if d.spans != 1+n || len(d.spanErr) != 0 {
				t.Errorf("1 query and %d overtaken statement(s) ran: %d spans, error statuses %v; want %d spans, none with an error\n %s",
					n, d.spans, d.spanErr, 1+n, d)
			}
		})
		t.Run(fmt.Sprintf("refused by the new rules, batch %v", batch), func(t *testing.T) {
			spans, out := runReloadedBeforeConn(t, start, closed, batch)
			if out == nil {
				t.Fatal("the statement ran in a budget closed by a zero limit")
			}
			wantOneSpanEach(t, spans, n, "pgtraffic: blocked by b (concurrency)")
		})
	}
}

// runReloadedBeforeConn runs one pool statement (or a batch of two) admitted under rules
// before its connection, on a pool of one connection that the test holds; replaces the rules
// with next while the statement waits for it, then gives the connection back. It returns the
// spans recorded for the statement and its outcome.
func runReloadedBeforeConn(t *testing.T, rules, next string, batch bool) (tracetest.SpanStubs, error) {
	t.Helper()
	_, ends := openTallied(t, rules, 1, "")
	f := ends[0]
	p := f.pool
	ctx := tagging.With(context.Background(), "app", "x")
	raw, err := p.Raw().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res := sendInBackground(ctx, p, batch, 0)
	pendingEventually(t, "the statement admitted, waiting for the connection", func() bool {
		return poolBudget(t, p, "b").InFlight == 1
	})
	f.setConfig(t, next)
	raw.Release()
	var out error
	select {
	case out = <-res:
	case <-time.After(30 * time.Second): // a watchdog only
		t.Fatal("the statement never ended")
	}
	poolHoldsNothing(t, p, "after the statement")
	return f.spans.GetSpans(), out
}

// wantOneSpanEach checks that spans are n, one per statement, each ended once with the status
// description status ("" for none).
func wantOneSpanEach(t *testing.T, spans tracetest.SpanStubs, n int, status string) {
	t.Helper()
	var got []string
	for _, sp := range spans {
		got = append(got, fmt.Sprintf("%s %q [%s %s]", sp.Name, sp.Status.Description,
			sp.StartTime.Format("15:04:05.000"), sp.EndTime.Format("15:04:05.000")))
	}
	if len(spans) != n {
		t.Fatalf("%d statement(s), %d spans, want one each: %q", n, len(spans), got)
	}
	for _, sp := range spans {
		if sp.Status.Description != status {
			t.Errorf("span status %q, want %q: %q", sp.Status.Description, status, got)
		}
	}
}
