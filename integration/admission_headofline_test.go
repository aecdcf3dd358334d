package integration

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestAdmissionWaiterForOneBudgetDoesNotBlockAnother: a service-wide budget `all`
// (max_concurrent 10, max_wait 1s) selects every statement; a narrow budget `reporting`
// (max_concurrent 1, max_wait 30s) selects the reports too. One report runs and a second waits
// for reporting's slot. A web statement, selected by `all` alone, with 9 of all's 10 slots
// free, runs at once: statements are admitted "the moment there is room", and the waiting
// report holds in `all` only the slot it needs there. (It used to hold up all's queue whole:
// the web statement waited out all's max_wait and was refused with a denial naming budget all
// but reporting's limit, "max_concurrent=1".)
func TestAdmissionWaiterForOneBudgetDoesNotBlockAnother(t *testing.T) {
	const rules = `
budgets:
  - {name: all, mode: enforce, max_concurrent: 10, max_wait: 1s}
  - {name: reporting, mode: enforce, max_concurrent: 1, max_wait: 30s}
rules:
  - {budget: all, match: {svc: shop}}
  - {budget: reporting, match: {app: reporting}}
`
	for _, fe := range openFrontEnds(t, rules, 8) {
		t.Run(fe.name, func(t *testing.T) {
			shop := tagging.With(context.Background(), "svc", "shop")
			report := tagging.With(shop, "app", "reporting")
			release, err := fe.hold(report, "select 1") // the running report
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			waiting := make(chan error, 1)
			go func() { waiting <- fe.exec(report, "select 2") }()
			mustEventually(t, "the second report waiting", func() bool { return fe.budget("reporting").Waiting == 1 })

			start := time.Now()
			err = fe.exec(shop, "select 3")
			took := time.Since(start)
			all := fe.budget("all")
			t.Logf("web statement: %v after %v; budget all: %d in flight, %d waiting", err, took, all.InFlight, all.Waiting)
			if err != nil {
				t.Errorf("a statement of budget all alone, with 9 of its 10 slots free, behind a report waiting for reporting's slot: %v after %v", err, took)
			}
			release()
			if err := <-waiting; err != nil {
				t.Errorf("the waiting report: %v", err)
			}
		})
	}
}
