package coord

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// TestFleetIdleTenantsLeaveRedis: a budget `per: tenant` sees 20,000 tenants at once (a
// nightly job that touches every tenant), then only one tenant stays active. The package
// documentation ("Capacity leases") says that a partition lapses a few intervals after its
// last instance left, that the sweep goes round the hash about once every four intervals
// whatever the partitions the calls carry, and that 100,000 tenants cost 100,000 fields only
// while they are all active: Redis memory is bounded and expiring. The instance leaves the
// idle tenants' partitions after idle syncs and their fields lapse soon after; 40 intervals
// later the hash must hold hardly any of them, though each sync carries two partitions (a
// sweep sized by the partitions a call carries would delete 32 fields a sync, and leave
// 100,000 dead tenants in Redis for about 3,000 intervals behind one live one).
func TestFleetIdleTenantsLeaveRedis(t *testing.T) {
	rc := newClient(t, redistest.Need(t))
	ctx := context.Background()
	spec := Spec{Name: "tenants", Rate: 1, Burst: 1, MaxConcurrent: 4}
	keys := make([]string, 20000)
	for i := range keys {
		keys[i] = fmt.Sprintf("tenant-%d", i)
	}
	const interval = 200 * time.Millisecond
	c := newCoord(t, Options{Client: rc, Interval: interval, Logger: quiet})
	local := newFakeLocal(0.0001, 1, keys...)
	c.Register(spec, local)
	mustSync(t, c)
	hkey := PartitionsKey("", spec.Name)
	peak := rc.HLen(ctx, hkey).Val()
	// The premise: the tenants are in Redis. Nearly all: on a loaded machine the first sync's
	// calls (20,000 partitions in chunks) can last past the first chunks' leases, which the
	// later calls' sweep then deletes.
	if peak < int64(len(keys))*9/10 {
		t.Fatalf("%d fields while %d tenants are active", peak, len(keys))
	}
	local.mu.Lock()
	local.keys = keys[:1] // every tenant but one goes quiet
	local.mu.Unlock()
	const idle = 40 // intervals: many lease durations (2.5 intervals each)
	for range idle {
		time.Sleep(interval)
		mustSync(t, c)
	}
	if d := partitionLapse(t, rc, spec.Name, keys[len(keys)-1]); d > 0 {
		t.Fatalf("an idle tenant's partition has not lapsed after %d intervals (lapses in %v): the scenario is wrong", idle, d)
	}
	n := rc.HLen(ctx, hkey).Val()
	mem := rc.MemoryUsage(ctx, hkey).Val()
	t.Logf("%d fields at the peak; %d fields (%d bytes) %d intervals after all but one tenant went quiet", peak, n, mem, idle)
	if n > peak/10 {
		t.Errorf("%d intervals after %d tenants went quiet (their partitions left and lapsed), Redis still holds %d of their fields "+
			"(%d bytes): the memory of lapsed partitions is not given back while one tenant stays active", idle, len(keys)-1, n-1, mem)
	}
}
