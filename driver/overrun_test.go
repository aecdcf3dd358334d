package driver

import (
	"context"
	"database/sql"
	"runtime"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// Without max_duration, overrunContext returns the caller's context itself and no cancel
// func: no derived context, so no timer. With it, a deadline at the bound after the start.
func TestOverrunContextOnlyWithMaxDuration(t *testing.T) {
	ctx := tagging.With(context.Background(), "app", "a")
	qctx, cancel := overrunContext(ctx, &ticket{})
	if qctx != ctx || cancel != nil {
		t.Errorf("no max_duration: got a derived context (cancel %v)", cancel != nil)
	}
	tk := &ticket{}
	x := &tk.Exec
	x.MaxDuration = time.Hour
	qctx, cancel = overrunContext(ctx, tk)
	if cancel == nil {
		t.Fatal("max_duration: no cancel func")
	}
	defer cancel()
	if d, ok := qctx.Deadline(); !ok || !d.Equal(x.Start().Add(time.Hour)) {
		t.Errorf("max_duration: deadline %v (%v), want the start + 1h", d, ok)
	}
}

// A statement of a budget without max_duration (or with one in warn mode, which only warns
// at the end) reaches the connection under the caller's own context, whether run directly,
// prepared or as rows held open: the driver added no deadline, hence no timer, and holding
// many such statements open adds no goroutine per statement. A statement of an enforce
// max_duration reaches it under a deadline: the fake connection sees what the driver passes.
func TestNoMaxDurationNoTimerNoGoroutine(t *testing.T) {
	h := newTelHarness(t, `
budgets:
  - {name: plain, mode: enforce, max_concurrent: 1000, per_query_limit: 1h}
  - {name: watched, mode: warn, max_duration: 1h}
  - {name: bounded, mode: enforce, max_duration: 1h}
rules:
  - {budget: plain, match: {app: plain}}
  - {budget: watched, match: {app: watched}}
  - {budget: bounded, match: {app: bounded}}
`)
	const n = 64
	h.db.SetMaxIdleConns(n)
	for _, tt := range []struct {
		app      string
		deadline bool
	}{{"plain", false}, {"watched", false}, {"bounded", true}} {
		t.Run(tt.app, func(t *testing.T) {
			ctx := tagging.With(context.Background(), "app", tt.app)
			from := len(h.sent.contexts())
			if _, err := h.db.ExecContext(ctx, "UPDATE items SET n = $1 WHERE id = $2", 1, 2); err != nil {
				t.Fatal(err)
			}
			stmt, err := h.db.PrepareContext(ctx, "SELECT id FROM items WHERE id = $1")
			if err != nil {
				t.Fatal(err)
			}
			defer stmt.Close()
			if _, err := stmt.ExecContext(ctx, 1); err != nil {
				t.Fatal(err)
			}
			runtime.GC()
			before := runtime.NumGoroutine()
			open := make([]*sql.Rows, 0, n)
			for i := range n {
				rows, err := h.db.QueryContext(ctx, "SELECT id FROM items WHERE id > $1", i)
				if err != nil {
					t.Fatal(err)
				}
				open = append(open, rows)
			}
			during := runtime.NumGoroutine()
			for _, rows := range open {
				if err := rows.Close(); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("goroutines: %d before, %d with %d statements held open", before, during, n)
			if !tt.deadline && during-before >= n/4 {
				t.Errorf("%d statements held open: %d goroutines more", n, during-before)
			}
			ctxs := h.sent.contexts()[from:]
			if len(ctxs) != n+2 {
				t.Fatalf("the connection saw %d statements, want %d", len(ctxs), n+2)
			}
			for i, c := range ctxs {
				_, has := c.Deadline()
				if has != tt.deadline || !tt.deadline && c != ctx {
					t.Fatalf("statement %d: deadline %v, the caller's context %v; want a deadline: %v",
						i, has, c == ctx, tt.deadline)
				}
			}
		})
	}
}
