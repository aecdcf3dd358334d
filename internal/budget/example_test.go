package budget_test

import (
	"fmt"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/budget"
)

func Example() {
	// A quarter of an 8-core server, bursts of up to 10 execution seconds.
	reporting := budget.New(budget.Spec{Rate: 0.25 * 8, Burst: 10, MaxConcurrent: 4})
	now := time.Unix(1_700_000_000, 0)

	reqs := []budget.Request{{Budget: reporting, Cost: 9}}
	if _, d := budget.Admit(now, reqs, nil); d == nil {
		fmt.Println("first query admitted")
	}
	// The query ran for 8s rather than the 9s predicted: a 1s refund.
	budget.Release(now, &reqs[0], 8)

	reqs[0].Cost = 4
	_, d := budget.Admit(now, reqs, nil)
	fmt.Printf("second query: %s over %s, retry after %v\n", d.Reason, d.Limit, d.RetryAfter)

	_, d = budget.Admit(now.Add(d.RetryAfter), reqs, nil)
	fmt.Println("admitted after waiting:", d == nil)
	// Output:
	// first query admitted
	// second query: budget over burst_limit=10s, retry after 1s
	// admitted after waiting: true
}
