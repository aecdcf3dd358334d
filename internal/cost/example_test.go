package cost_test

import (
	"fmt"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/cost"
)

// The decision path with explain mode pattern: a cached plan cost times the learned k, and
// training on completion.
func ExampleModel() {
	m := cost.NewModel(1000)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const fp = 0xfeed

	// First execution: no plan cached, so EXPLAIN ran (cost 40,000 units) and the prediction
	// uses the default global k.
	m.PutPlan(now, fp, 40_000)
	p := m.Predict(now, fp, 0)
	predicted := p.Seconds
	fmt.Printf("before history: %.3fs\n", predicted)

	// The statement took 0.2 s; from now on the pattern's own k applies.
	m.Observe(fp, "", p.PlanCost, 0.2, true, 1) // its own plan: EXPLAIN ran for it
	p = m.Predict(now, fp, 0)
	fmt.Printf("after one execution: %.3fs (k = %.1e s/unit)\n", p.Seconds, p.Seconds/p.PlanCost)
	// Output:
	// before history: 0.140s
	// after one execution: 0.200s (k = 5.0e-06 s/unit)
}
