package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestReloadReachesStatementsInExplain: the incident runbook's case. A migration's lock holds a
// new pattern's EXPLAIN, and four statements of the pattern pile up, the first in its EXPLAIN,
// the others waiting for it; the responder closes their budget (max_concurrent: 0), and a new
// statement is refused, so the reload is in force. Once the lock goes, none of the four runs:
// each is decided under the rules in force (on database/sql all four ran, on the pool the one
// that had explained). A reload that removes the budget instead lets the held one run, and
// nothing is left in flight or waiting.
func TestReloadReachesStatementsInExplain(t *testing.T) {
	rules := func(maxConcurrent string) string {
		return "budgets: [{name: b, mode: enforce, max_concurrent: " + maxConcurrent +
			", per_query_limit: 10s}]\nrules: [{budget: b, match: {app: x}}]\n"
	}
	removed := "budgets: [{name: c, mode: enforce, max_concurrent: 0}]\nrules: [{budget: c, match: {app: y}}]\n"
	for _, tc := range []struct {
		name, after string
		n           int // statements held in or behind the EXPLAIN
		refused     bool
	}{{"closed", rules("0"), 4, true}, {"removed", removed, 1, false}} {
		for name, open := range openReloadFronts(rules("8")) {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				f := open(t)
				ctx := tagging.With(context.Background(), "app", "x")
				if err := f.exec(context.Background(), "create table held (id int)"); err != nil {
					t.Fatal(err)
				}
				tx := lockTable(t, f.dsn, "held")
				done := make(chan error, tc.n)
				for range tc.n {
					go func() { done <- f.exec(ctx, "select count(*) from held") }()
				}
				time.Sleep(500 * time.Millisecond) // the first in its EXPLAIN, the others behind it
				if err := f.reload(tc.after); err != nil {
					t.Fatal(err)
				}
				if err := f.exec(ctx, "select 1"); tc.refused && !errors.Is(err, driver.ErrBlocked) {
					t.Fatalf("the reload closing the budget is not in force: %v", err)
				}
				if err := tx.Commit(context.Background()); err != nil {
					t.Fatal(err)
				}
				for range tc.n {
					select {
					case err := <-done:
						if errors.Is(err, driver.ErrBlocked) != tc.refused {
							t.Errorf("a statement held while its budget was %s: %v", tc.name, err)
						}
					case <-time.After(10 * time.Second):
						t.Fatal("a statement hangs")
					}
				}
				if !eventually(3*time.Second, func() bool { return f.snap().InFlight == 0 }) {
					t.Errorf("%d statements in flight after all ended", f.snap().InFlight)
				}
				if b, ok := budgetNamed(f.snap(), "b"); ok && (b.InFlight != 0 || b.Waiting != 0) {
					t.Errorf("budget b after all ended: %d in flight, %d waiting", b.InFlight, b.Waiting)
				}
			})
		}
	}
}
