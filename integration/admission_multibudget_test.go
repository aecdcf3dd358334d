package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestAdmissionMultiBudgetMaxWaitOfTheBudgetHoldingItBack: a statement selecting two budgets,
// both full when it arrives, is held back by the budget `fast` (max_wait: 300ms) once the
// other's slot frees. It is refused after about fast's max_wait, as a statement of fast alone
// is, whatever order the budgets and rules are written in: each refusal is judged by the
// max_wait of the budget that makes it, not of the one that refused the statement first
// (`slow`, max_wait: 10s, held it back 10 s when listed first).
func TestAdmissionMultiBudgetMaxWaitOfTheBudgetHoldingItBack(t *testing.T) {
	const slowBudget = `  - {name: slow, mode: enforce, max_concurrent: 1, max_wait: 10s}` + "\n"
	const fastBudget = `  - {name: fast, mode: enforce, max_concurrent: 1, max_wait: 300ms}` + "\n"
	const slowRule = `  - {budget: slow, match: {x: a}}` + "\n"
	const fastRule = `  - {budget: fast, match: {y: b}}` + "\n"
	orders := []struct{ name, rules string }{
		{"fast-first", "budgets:\n" + fastBudget + slowBudget + "rules:\n" + fastRule + slowRule},
		{"slow-first", "budgets:\n" + slowBudget + fastBudget + "rules:\n" + slowRule + fastRule},
	}
	for _, o := range orders {
		for _, fe := range openFrontEnds(t, o.rules, 6) {
			t.Run(o.name+"/"+fe.name, func(t *testing.T) {
				bg := context.Background()
				ca, cb := tagging.With(bg, "x", "a"), tagging.With(bg, "y", "b")
				both := tagging.With(ca, "y", "b")
				releaseSlow, err := fe.hold(ca, "select 1")
				if err != nil {
					t.Fatal(err)
				}
				defer releaseSlow()
				releaseFast, err := fe.hold(cb, "select 2")
				if err != nil {
					t.Fatal(err)
				}
				defer releaseFast()

				// A statement of fast alone: refused after fast's max_wait.
				start := time.Now()
				err = fe.exec(cb, "select 3")
				fastAlone := time.Since(start)
				if be := (*driver.BlockedError)(nil); !errors.As(err, &be) || be.Budget != "fast" {
					t.Fatalf("fast alone: %v", err)
				}

				// A statement of both budgets; slow's slot frees while it waits, fast's never does.
				res := make(chan error, 1)
				start = time.Now()
				go func() { res <- fe.exec(both, "select 4") }()
				mustEventually(t, "the statement waiting", func() bool {
					return fe.budget("slow").Waiting+fe.budget("fast").Waiting >= 1
				})
				releaseSlow()
				select {
				case err = <-res:
				case <-time.After(60 * time.Second):
					t.Fatal("never answered")
				}
				took := time.Since(start)
				var be *driver.BlockedError
				if !errors.As(err, &be) || be.Budget != "fast" {
					t.Fatalf("want a refusal by fast: %v", err)
				}
				t.Logf("fast alone refused after %v; both refused by fast after %v", fastAlone, took)
				if took > 5*fastAlone {
					t.Errorf("held back by fast (max_wait 300ms) for %v before its refusal, %.0f× a statement of fast alone (%v)",
						took, float64(took)/float64(fastAlone), fastAlone)
				}
			})
		}
	}
}
