package coord

import (
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/budget"
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
