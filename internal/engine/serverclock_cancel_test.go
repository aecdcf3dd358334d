package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestServerClockCancelledStatementCharged: a pattern on the server's clock is charged
// its prediction (the server's mean) rather than what the client measured, because the server's
// reports true it up. But pg_stat_statements records only statements that complete: a statement
// cancelled (its context's deadline, max_duration) after running 5 s on the server is never in
// any report. It must still cost its budget about the 5 s it ran, else a pattern whose
// statements keep timing out runs far past its server_share.
func TestServerClockCancelledStatementCharged(t *testing.T) {
	for _, cause := range []error{context.DeadlineExceeded, fmt.Errorf("cancelled: %w", ErrOverrun)} {
		t.Run(cause.Error(), func(t *testing.T) {
			e, clk := newEngine(t, `
budgets:
  - {name: b, mode: enforce, server_share: 0.01, burst_limit: 100s, max_duration: 5s}
rules:
  - {budget: b, match: {app: x}}
`)
			ctx := tagging.With(context.Background(), "app", "x")
			conn := &plannedConn{plan: 100, id: 77}
			const q = "select * from t where v = $1"
			start := func() *Exec {
				t.Helper()
				x := new(Exec)
				if _, err := e.Begin(ctx, x, conn, q, []any{1}); err != nil {
					t.Fatal(err)
				}
				return x
			}
			x := start()
			clk.Advance(10 * time.Millisecond)
			x.Finish(ctx, nil)
			if e.ObserveServer(x.Pattern.FingerprintID, 77, 0.01, clk.Now().Add(time.Hour)) != nil {
				t.Fatal("server report not taken")
			}
			b := budgetNamed(t, e, "b").b
			before := b.Snapshot(clk.Now()).Debt
			x = start()
			if !x.server {
				t.Fatalf("statement not on the server's clock")
			}
			clk.Advance(5 * time.Second)
			x.Finish(ctx, cause)
			after := b.Snapshot(clk.Now()).Debt
			// 5 s ran; at most 0.05 s drained meanwhile.
			if got := after - before; got < 4.9 {
				t.Fatalf("a statement that ran 5 s and was cancelled (%v) added %.3f s of debt, want about 5 s "+
					"(the server never reports a cancelled statement)", cause, got)
			}
		})
	}
}
