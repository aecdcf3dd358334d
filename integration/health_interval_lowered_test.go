package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestHealthIntervalLoweredKeepsAdmitting: a budget admits on a good sample (custom.knob is 1,
// under its threshold of 5) read by a sampler at health_interval 5s. A reload that only lowers
// health_interval to 600ms changes nothing about the server. The CHANGELOG says the new sampler
// "starts from the last sample" so that throttling "neither lifts nor starts until it reads",
// and the contract calls a sample stale only when it is older than three intervals: a sample
// 2.5s old was taken well within the three intervals of the sampler that took it (15s). The
// carried sample is judged by that sampler's interval until the new sampler has opened its own
// connection and read (here a health query taking 100ms, as a busy server answers): judged by
// the new interval (stale after 1.8s), it would have every enforce budget on it refuse healthy
// traffic as "sample is stale" meanwhile.
func TestHealthIntervalLoweredKeepsAdmitting(t *testing.T) {
	const rules = `
health_interval: %s
health_queries: {knob: "select v from knob, pg_sleep(0.1)"}
budgets:
  - {name: batch, mode: enforce, throttle_when: {custom.knob: 5}}
rules:
  - {budget: batch, match: {job: import}}
`
	c, db := openRules(t, fmt.Sprintf(rules, "5s"))
	ctx := context.Background()
	mustExec(t, db, ctx, "create table knob (v int)")
	mustExec(t, db, ctx, "insert into knob values (1)") // under the threshold: admitted
	batch := tagging.With(ctx, "job", "import")
	waitFor(t, healthSettle, "the first sample admits the batch", func() (bool, string) {
		err := c.Check(batch)
		return err == nil, fmt.Sprint(err)
	})
	// The sample ages, well within its own sampler's three intervals (15s), but past three of the
	// interval the reload brings (1.8s).
	time.Sleep(2500 * time.Millisecond)
	if err := c.Check(batch); err != nil {
		t.Fatalf("before the reload, Check = %v; want nil (a 2.5s-old sample at a 5s interval is fresh)", err)
	}

	cfg, err := driver.ParseConfig([]byte(fmt.Sprintf(rules, "600ms")))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	refused := 0
	var firstErr error
	start := time.Now()
	for time.Since(start) < 400*time.Millisecond {
		if err := c.Check(batch); err != nil {
			if refused == 0 {
				firstErr = err
			}
			refused++
		}
		time.Sleep(5 * time.Millisecond)
	}
	if refused > 0 {
		t.Errorf("after a reload that only lowered health_interval, Check refused the healthy batch %d times "+
			"(first: %v); custom.knob is still 1 < 5: want it admitted throughout", refused, firstErr)
	}
}
