package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestHealthIntervalReloadKeepsThrottling: a budget is throttled on a fresh sample (a custom
// metric over its threshold). A reload that changes only health_interval replaces the sampler
// (a Sampler's interval is fixed); the new one must start from the old one's readings, not from
// none: "not read yet, configured less than 3 intervals ago" is neither exceeded nor stale, so
// the budget would admit everything until the new sampler's first read completes (up to three
// intervals when the server is slow to answer, which is when it is throttled). Nothing changed
// about the server: the throttled batch must stay throttled.
func TestHealthIntervalReloadKeepsThrottling(t *testing.T) {
	const rules = `
health_interval: %s
health_queries: {knob: "select v from knob, pg_sleep(0.15)"}
budgets:
  - {name: batch, mode: enforce, throttle_when: {custom.knob: 5}}
rules:
  - {budget: batch, match: {job: import}}
`
	c, db := openRules(t, fmt.Sprintf(rules, "500ms"))
	ctx := context.Background()
	mustExec(t, db, ctx, "create table knob (v int)")
	mustExec(t, db, ctx, "insert into knob values (10)") // over the threshold: throttled
	batch := tagging.With(ctx, "job", "import")
	waitFor(t, healthSettle, "the batch is throttled on custom.knob", func() (bool, string) {
		return healthBlocked(c.Check(batch), "batch", "custom.knob=")
	})

	cfg, err := driver.ParseConfig([]byte(fmt.Sprintf(rules, "600ms")))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	admitted := 0
	var first time.Duration
	start := time.Now()
	for time.Since(start) < 400*time.Millisecond {
		if err := c.Check(batch); err == nil {
			if admitted == 0 {
				first = time.Since(start)
			}
			admitted++
		}
		time.Sleep(5 * time.Millisecond)
	}
	if admitted > 0 {
		t.Errorf("after a reload that only changed health_interval, Check admitted the throttled batch %d times "+
			"(first %v after SetConfig); custom.knob is still 10 >= 5: want it refused throughout", admitted, first.Round(time.Millisecond))
	}
}
