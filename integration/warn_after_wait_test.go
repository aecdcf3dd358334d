package integration

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestWarnBudgetJudgedAtAdmission: a statement of an enforce budget that makes it wait for a slot
// (max_concurrent 1, max_wait 10s) and of a warn budget with a bucket (server_share 0.5 of one
// core, burst_limit 1s) is judged by the warn budget when the enforce one admits it, as enforce
// judges all of a statement's budgets together: the bucket, too full for the statement's learned
// cost (0.6 s) at its arrival, has drained by the time the slot frees 1.5 s later, so the warn
// budget must not warn about it: enforce would have admitted it then.
func TestWarnBudgetJudgedAtAdmission(t *testing.T) {
	for _, fe := range openFrontEnds(t, `
server_cores: 1
budgets:
  - {name: e, mode: enforce, max_concurrent: 1, max_wait: 10s}
  - {name: w, mode: warn, server_share: 0.5, burst_limit: 1s}
rules:
  - {budget: e, match: {app: r}}
  - {budget: w, match: {tenant: t1}}
`, 4) {
		t.Run(fe.name, func(t *testing.T) {
			bg := context.Background()
			tenant := tagging.With(bg, "tenant", "t1")
			both := tagging.With(tenant, "app", "r")
			const stmt = "select pg_sleep(0.6)"
			if err := fe.exec(tenant, stmt); err != nil { // learned: 0.6 s, the bucket's debt 0.6
				t.Fatal(err)
			}
			release, err := fe.hold(tagging.With(bg, "app", "r"), "select generate_series(1, 3)") // e's only slot
			if err != nil {
				t.Fatal(err)
			}
			time.AfterFunc(1500*time.Millisecond, release)
			before := fe.budget("w")
			if err := fe.exec(both, stmt); err != nil { // arrives with 0.6 + 0.6 over 1 s: waits for e
				t.Fatal(err)
			}
			after := fe.budget("w")
			if n := after.Warned - before.Warned; n != 0 {
				t.Errorf("warn budget w warned about %d statements (%v), judged at their arrival; when e admitted "+
					"the statement, 1.5 s later, w's bucket had room", n, after.WarnedBy)
			}
		})
	}
}
