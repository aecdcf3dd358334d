package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestHealthQueryReformatKeepsThrottling: a batch budget is throttled on a fresh sample of a
// custom metric (custom.knob is 10, its threshold 5). An operator reloads the rules with the
// same health query reformatted (a line break, as a YAML editor or a template rewrites it): the
// server, the metric and the threshold are unchanged. throttle_when promises that "while any
// [threshold] is reached the budget admits nothing", and the CHANGELOG fixed exactly this for a
// reload of health_interval ("admitted statements of throttled budgets until the new sampler's
// first read"). The metric keeps its last reading, by its name, until the reformatted query has
// been read once (here 150ms, as a busy server answers: a throttled server is a busy one): taken
// for a new metric "not read yet", it would let the throttled batch through meanwhile.
func TestHealthQueryReformatKeepsThrottling(t *testing.T) {
	const rules = `
health_interval: 500ms
health_queries: {knob: %q}
budgets:
  - {name: batch, mode: enforce, throttle_when: {custom.knob: 5}}
rules:
  - {budget: batch, match: {job: import}}
`
	query := "select v from knob, pg_sleep(0.15)"
	c, db := openRules(t, fmt.Sprintf(rules, query))
	ctx := context.Background()
	mustExec(t, db, ctx, "create table knob (v int)")
	mustExec(t, db, ctx, "insert into knob values (10)") // over the threshold: throttled
	batch := tagging.With(ctx, "job", "import")
	waitFor(t, healthSettle, "the batch is throttled on custom.knob", func() (bool, string) {
		return healthBlocked(c.Check(batch), "batch", "custom.knob=")
	})

	cfg, err := driver.ParseConfig([]byte(fmt.Sprintf(rules, "select v\nfrom knob, pg_sleep(0.15)")))
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
		t.Errorf("after a reload that only reformatted the health query, Check admitted the throttled batch %d times "+
			"(first %v after SetConfig); custom.knob is still 10 >= 5: want it refused throughout", admitted, first.Round(time.Millisecond))
	}
}
