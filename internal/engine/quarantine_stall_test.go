package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestQuarantineStallIsOneStrike: a stall of the server (a paused VM, a storage hang) cuts
// every statement in flight at its max_duration at once. Statements of one pattern that ran
// together overran as one event: they count one strike, so a quick pattern that happened to
// be busy is not quarantined for the window after the server recovers. A pattern that keeps
// overrunning, statement after statement, still is.
func TestQuarantineStallIsOneStrike(t *testing.T) {
	e, clk := newEngine(t, quarantineRules) // after: 2, max_duration: 300ms
	ctx := tagging.With(context.Background(), "app", "r")
	const lookup = "select v from t where id = $1"
	var xs []*Exec
	for range 4 {
		x, err := begin(e, ctx, lookup)
		if err != nil {
			t.Fatal(err)
		}
		xs = append(xs, x)
		clk.Advance(time.Millisecond)
	}
	clk.Advance(300 * time.Millisecond) // the server stalls: all four are cut off
	for _, x := range xs {
		x.Finish(ctx, fmt.Errorf("timeout: %w", ErrOverrun))
	}
	if err := run(e, clk, ctx, lookup, 0); err != nil {
		t.Fatalf("after four statements that ran together overran once: %v", err)
	}
	if q := e.Quarantines(); len(q) != 0 {
		t.Fatalf("quarantined after one stall: %+v", q)
	}
	// The same pattern overrunning again, begun after the first overrun: a second strike.
	overrun(t, e, clk, ctx, lookup)
	if d := denial(t, run(e, clk, ctx, lookup, 0)); d.Reason != vocab.ReasonQuarantine {
		t.Fatalf("after a second overrun: %+v, want quarantine", d)
	}
}
