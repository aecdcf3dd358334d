package engine

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// coldBuf is larger than the CPU caches: writing a byte of each of its cache lines evicts the
// engine's state, as a statement's round trip through the kernel does in a real process. It is
// made by the benchmark, so that other tests of the package (the memory bounds) do not count it.
var coldBuf []byte

func evictCaches() {
	for i := 0; i < len(coldBuf); i += 64 {
		coldBuf[i]++
	}
}

// BenchmarkColdPath is BenchmarkDecisionPath with cold caches: before each statement it evicts
// the caches, then times Begin and Finish alone (ns/cold; ns/op includes the eviction and means
// nothing). Between two statements of a real client the kernel sends and receives, so the
// engine's state is partly cold; this is its worst case, where every cache line the path touches
// is a miss.
func BenchmarkColdPath(b *testing.B) {
	if coldBuf == nil {
		coldBuf = make([]byte, 8<<20)
	}
	for _, c := range []struct{ name, rules string }{{"no-rules", ""}, {"budget", rulesN(10)}} {
		b.Run(c.name, func(b *testing.B) {
			// The driver's path: the real clock.
			e, _ := newEngine(b, c.rules, func(o *Options) { o.Now, o.After = nil, nil })
			ctx := tagging.With(context.Background(), "app", "bench")
			q := "select * from orders where id = $1"
			p, _ := e.patterns.Get(q)
			e.model.PutPlan(time.Now(), p.FingerprintID, 8.3) // as the first EXPLAIN would
			x := new(Exec)                                    // the connection's, reused
			for range 2 * warmSamples {                       // a warm pattern
				if _, err := e.Begin(ctx, x, nil, q, nil); err != nil {
					b.Fatal(err)
				}
				x.Finish(ctx, nil)
			}
			var total time.Duration
			for b.Loop() {
				evictCaches()
				t0 := time.Now()
				if _, err := e.Begin(ctx, x, nil, q, nil); err != nil {
					b.Fatal(err)
				}
				x.Finish(ctx, nil)
				total += time.Since(t0)
			}
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/cold")
		})
	}
}
