package budget

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// benchSpec never denies at the benchmarks' costs, so every iteration takes
// the full admit-and-release path.
var benchSpec = Spec{MaxConcurrent: 1 << 20, PerQueryLimit: 10, Rate: 1000, Burst: 1e6, WarningThreshold: 0.9}

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "tenant-" + strconv.Itoa(i)
	}
	return keys
}

func BenchmarkAdmitRelease(b *testing.B) {
	cases := []struct {
		name    string
		keys    int // 0: the unkeyed budget
		maxKeys int
	}{
		{"one key", 0, 0},
		{"1k keys", 1000, 0},
		{"100k keys", 100_000, 0},
		{"churn 10k keys through 1k", 10_000, 1000},
	}
	{
		for _, c := range cases {
			b.Run("serial/"+c.name, func(b *testing.B) {
				sp := benchSpec
				sp.MaxKeys = c.maxKeys
				bud := New(sp)
				keys := benchKeys(max(c.keys, 1))
				if c.keys == 0 {
					keys[0] = ""
				}
				reqs := []Request{{Budget: bud, Cost: 1e-4}}
				warns := make([]Warning, 0, 4)
				now := t0
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					now = now.Add(time.Microsecond)
					k := keys[i%len(keys)]
					reqs[0].Key = k
					if _, d := Admit(now, reqs, warns[:0]); d != nil {
						b.Fatalf("denied: %+v", *d)
					}
					Release(now, &reqs[0], 1e-4)
				}
			})
		}
	}
	for _, c := range cases[:2] {
		b.Run("parallel/"+c.name, func(b *testing.B) {
			bud := New(benchSpec)
			keys := benchKeys(max(c.keys, 1))
			if c.keys == 0 {
				keys[0] = ""
			}
			var clock, next atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				reqs := []Request{{Budget: bud, Cost: 1e-4}}
				warns := make([]Warning, 0, 4)
				i := int(next.Add(1)) * 7919
				for pb.Next() {
					now := t0.Add(time.Duration(clock.Add(1000)))
					i++
					k := keys[i%len(keys)]
					reqs[0].Key = k
					if _, d := Admit(now, reqs, warns[:0]); d != nil {
						b.Errorf("denied: %+v", *d)
						return
					}
					Release(now, &Request{Budget: bud, Key: k, Cost: 1e-4}, 1e-4)
				}
			})
		})
	}
	b.Run("serial/three budgets", func(b *testing.B) {
		b1, b2, b3 := New(benchSpec), New(benchSpec), New(benchSpec)
		reqs := []Request{{Budget: b3, Key: "t1", Cost: 1e-4}, {Budget: b1, Cost: 1e-4}, {Budget: b2, Key: "x", Cost: 1e-4}}
		warns := make([]Warning, 0, 4)
		now := t0
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			now = now.Add(time.Microsecond)
			if _, d := Admit(now, reqs, warns[:0]); d != nil {
				b.Fatalf("denied: %+v", *d)
			}
			for _, r := range reqs {
				Release(now, &Request{Budget: r.Budget, Key: r.Key, Cost: r.Cost}, r.Cost)
			}
		}
	})
}

// BenchmarkDenied measures a refusal by the bucket, which allocates its Denial.
func BenchmarkDenied(b *testing.B) {
	bud := New(Spec{Rate: 1, Burst: 1})
	reqs := []Request{{Budget: bud, Cost: 1}}
	Admit(t0, reqs, nil)
	b.ReportAllocs()
	for range b.N {
		if _, d := Admit(t0, reqs, nil); d == nil {
			b.Fatal("admitted")
		}
	}
}

// BenchmarkTakeUsage is what a sync of a budget per tenant with 100,000 active keys costs the
// coordinator to take their usage, its storage reused from one sync to the next as the
// coordinator does. Only TakeUsage is timed: each iteration first runs a statement of every
// key.
func BenchmarkTakeUsage(b *testing.B) {
	bud := New(Spec{Rate: 1000, Burst: 1000, MaxConcurrent: 2, MaxKeys: 200_000})
	t0 := time.Unix(1e9, 0)
	bud.SetShared(t0, nil, func() {}, time.Second)
	keys := benchKeys(100_000)
	for _, k := range keys {
		bud.SetLease(t0, k, Lease{Rate: 1, Burst: 1, Slots: 2})
	}
	var usage []Usage
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		now = now.Add(time.Second)
		for _, k := range keys {
			req := []Request{{Budget: bud, Key: k, Cost: 0.001}}
			if _, d := Admit(now, req, nil); d == nil {
				Release(now, &req[0], 0.001)
			}
		}
		b.StartTimer()
		if usage = bud.TakeUsage(now, usage[:0]); len(usage) != len(keys) {
			b.Fatalf("%d keys' usage, want %d", len(usage), len(keys))
		}
	}
}
