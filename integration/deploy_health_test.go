package integration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestDeployReloadAddingHealthMetricRefusesNothing: an enforce budget already throttled
// on one sampled metric (replication_lag, far from its threshold) gains a second one by a
// reload (active_queries: 1,000,000, which no test reaches). The README promises that a
// metric not read yet "neither throttles nor counts as stale (a connector that has just
// started does not refuse its first statements)", and reloads do not hold statements up: no
// statement may be refused for health while the reloads add and drop the metric.
func TestDeployReloadAddingHealthMetricRefusesNothing(t *testing.T) {
	base := `
health_interval: 1s
budgets:
  - {name: h, mode: enforce, throttle_when: {replication_lag: 1h%s}}
rules:
  - {budget: h, match: {app: h}}
`
	var logs lockedBuffer
	c, db := openRules(t, fmt.Sprintf(base, ""), driver.WithLogger(logs.logger()))
	db.SetMaxOpenConns(8)
	ctx := tagging.With(context.Background(), "app", "h")
	// Wait for a first good replication_lag sample, so that the sampler runs.
	time.Sleep(1500 * time.Millisecond)
	if _, err := db.ExecContext(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var refused atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for !stop.Load() {
				_, err := db.ExecContext(ctx, "select 1")
				if err != nil {
					var be *driver.BlockedError
					if errors.As(err, &be) {
						refused.Add(1)
						first.CompareAndSwap(nil, be.Error())
						continue
					}
					t.Error(err)
					return
				}
			}
		})
	}
	for i := range 300 {
		extra := ""
		if i%2 == 0 {
			extra = ", active_queries: 1000000"
		}
		setRulesOn(t, c, fmt.Sprintf(base, extra))
		time.Sleep(time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	if n := refused.Load(); n > 0 {
		t.Errorf("%d statements refused while reloads added a health metric far from its threshold; first: %v", n, first.Load())
	}
	if contains(logs.String(), "threshold on a metric the sampler does not read") {
		t.Errorf("a reload adding a metric logged it as unread/stale:\n%s", logs.String())
	}
}
