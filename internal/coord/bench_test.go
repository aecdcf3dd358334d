package coord

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// BenchmarkKick is what a statement that starves pays to ask for an early sync: with a
// kick already pending, one atomic load and compare-and-swap.
func BenchmarkKick(b *testing.B) {
	c := newCoord(b, Options{Logger: quiet})
	h := c.Register(Spec{Name: "b", Rate: 1}, newFakeLocal(0, 0))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h.Kick()
		}
	})
}

// BenchmarkRound is one loop round with nothing due: what the loop costs between syncs for
// a budget of 1,000 active partitions.
func BenchmarkRound(b *testing.B) {
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676))
	}
	c := newTestCore(Spec{Name: "b", Rate: 1, Burst: 1, MaxConcurrent: 4})
	usage := make([]budget.Usage, len(keys))
	for i, k := range keys {
		usage[i] = budget.Usage{Key: k, Offered: 0.1, Wanted: 1}
	}
	grantAll(c, t0, func(string) result { return result{lease: budget.Lease{Rate: 0.1, Burst: 0.1, Slots: 1}, live: 2} })
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		c.absorb(now, usage)
		c.pushes(now)
	}
}

// BenchmarkSyncManyTenants is one sync of a budget with 100,000 active partitions against a
// real redis-server; redis-ms/op is the time Redis spent running the script.
func BenchmarkSyncManyTenants(b *testing.B) {
	rc := redis.NewClient(&redis.Options{Addr: redistest.Need(b).Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rc.Close()
	keys := make([]string, manyTenants)
	for i := range keys {
		keys[i] = fmt.Sprintf("tenant-%d", i)
	}
	c := newCoord(b, Options{Client: rc, Interval: time.Second, Logger: quiet})
	c.Register(Spec{Name: "tenants", Rate: 1, Burst: 1, MaxConcurrent: 2}, newFakeLocal(1, 1, keys...))
	if err := c.Sync(context.Background()); err != nil {
		b.Fatal(err)
	}
	rc.ConfigResetStat(context.Background())
	for b.Loop() {
		if err := c.Sync(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	// What Redis itself spent, apart from the client and the machine's load.
	stats := rc.Info(context.Background(), "commandstats").Val()
	if i := strings.Index(stats, "cmdstat_evalsha:"); i >= 0 {
		var calls, usec int64
		fmt.Sscanf(stats[i:], "cmdstat_evalsha:calls=%d,usec=%d", &calls, &usec)
		b.ReportMetric(float64(usec)/1e3/float64(b.N), "redis-ms/op")
	}
}

// BenchmarkSyncWorkManyTenants is the client's own work in one regular sync of a budget with
// 100,000 active partitions, without Redis: absorbing their usage, building the reports,
// applying the replies and working out the leases to hand over.
func BenchmarkSyncWorkManyTenants(b *testing.B) {
	usage := make([]budget.Usage, manyTenants)
	for i := range usage {
		usage[i] = budget.Usage{Key: fmt.Sprintf("tenant-%d", i), Offered: 0.001, Used: 0.001, Wanted: 1}
	}
	c := newTestCore(Spec{Name: "tenants", Rate: 1000, Burst: 1000, MaxConcurrent: 2})
	c.absorb(t0, usage)
	grant := func(string) result { return result{lease: budget.Lease{Rate: 0.01, Burst: 0.01, Slots: 1}, live: 1} }
	grantAll(c, t0, grant)
	b.ReportAllocs()
	for i := 1; b.Loop(); i++ {
		now := t0.Add(time.Duration(i) * time.Second)
		c.absorb(now, usage)
		for _, reps := range c.reports(now) {
			res := make([]result, len(reps))
			for j, r := range reps {
				res[j] = grant(r.p.key)
			}
			c.applied(now, now.Add(time.Millisecond), reps, res)
			c.pushesOf(reps, now)
		}
		c.pushes(now)
	}
}
