package pattern

import (
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// cheap is an analyzer for tests that need many misses: it does no parsing.
func cheap(key string) *Pattern {
	return &Pattern{Fingerprint: "0000000000000000", Kind: vocab.KindOther, Tables: []string{}}
}

func TestCacheHitMiss(t *testing.T) {
	c := NewCache(0)
	p1, hit := c.Get("SELECT * FROM t WHERE id = $1")
	if hit || p1.Kind != vocab.KindSelect {
		t.Fatalf("first Get: hit=%v kind=%q", hit, p1.Kind)
	}
	// Per-request comments map to the same entry.
	p2, hit := c.Get("/* traceparent='00-4bf92f3577b34da6-00f067aa0ba902b7-01' */ SELECT * FROM t WHERE id = $1 /*app='x'*/;")
	if !hit || p2 != p1 {
		t.Fatalf("commented Get: hit=%v same=%v", hit, p2 == p1)
	}
	hits, misses, size := c.Stats()
	if hits != 1 || misses != 1 || size != 1 {
		t.Fatalf("Stats = %d, %d, %d; want 1, 1, 1", hits, misses, size)
	}
	// An unparsable text is cached too.
	if _, hit := c.Get("SELEC 1"); hit {
		t.Fatal("first unparsable Get hit")
	}
	if p, hit := c.Get("SELEC 1"); !hit || p.Parsed {
		t.Fatalf("second unparsable Get: hit=%v parsed=%v", hit, p.Parsed)
	}
}

func TestCacheBound(t *testing.T) {
	for _, max := range []int{1, 10, 100, 1000, 5000} {
		t.Run(strconv.Itoa(max), func(t *testing.T) {
			c := newCache(max, defaultMaxBytes, cheap)
			for i := 0; i < 3*max+10; i++ {
				c.Get("SELECT " + strconv.Itoa(i))
				if _, _, size := c.Stats(); size > max {
					t.Fatalf("size %d > bound %d after %d inserts", size, max, i+1)
				}
			}
			if _, _, size := c.Stats(); size != max {
				t.Fatalf("size %d after filling, want %d", size, max)
			}
		})
	}
}

// TestCacheKeepsHotEntries checks CLOCK: an entry hit between inserts
// survives a stream of one-off statements.
// TestCacheFillsEveryShard checks that texts differing only in the middle
// (an inline literal) spread over the shards and fill the whole bound.
func TestCacheFillsEveryShard(t *testing.T) {
	c := newCache(10_000, defaultMaxBytes, cheap)
	for i := 0; i < 20_000; i++ {
		c.Get("SELECT * FROM orders WHERE tenant = " + strconv.Itoa(i) + " ORDER BY id LIMIT 50")
	}
	if _, _, size := c.Stats(); size != 10_000 {
		t.Fatalf("size %d after 20,000 distinct texts, want 10,000 (shards: %d)", size, len(c.shards))
	}
}

func TestCacheKeepsHotEntries(t *testing.T) {
	c := newCache(100, defaultMaxBytes, cheap)
	hot := "SELECT hot"
	c.Get(hot)
	for i := 0; i < 10_000; i++ {
		c.Get("SELECT " + strconv.Itoa(i))
		if _, hit := c.Get(hot); !hit && i > 0 {
			t.Fatalf("hot entry evicted after %d one-off statements", i)
		}
	}
}

func TestCacheByteBound(t *testing.T) {
	c := newCache(1000, 1<<20, cheap) // 1 MiB in total
	big := string(make([]byte, 200<<10))
	for i := 0; i < 50; i++ {
		c.Get(strconv.Itoa(i) + big)
	}
	var bytes int
	for i := range c.shards {
		s := &c.shards[i]
		if s.bytes > s.maxBytes {
			t.Fatalf("shard %d holds %d bytes > %d", i, s.bytes, s.maxBytes)
		}
		bytes += s.bytes
	}
	if bytes > 1<<20 {
		t.Fatalf("cache holds %d bytes > 1 MiB", bytes)
	}
	// A text larger than a shard's share is analysed but not cached.
	huge := string(make([]byte, 2<<20))
	if _, hit := c.Get(huge); hit {
		t.Fatal("huge text hit")
	}
	if _, hit := c.Get(huge); hit {
		t.Fatal("huge text was cached")
	}
}

// TestCacheMillionDistinct proves the bound under 1,000,000 distinct
// statements (100,000 under the race detector, which makes each insert ~15x
// slower). It injects a cheap analyzer: with pg_query each miss costs tens of
// microseconds, and the bound is the cache's property, not the parser's.
func TestCacheMillionDistinct(t *testing.T) {
	const max = 10_000
	n := 1_000_000
	if raceEnabled {
		n = 100_000
	}
	c := newCache(max, defaultMaxBytes, cheap)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 0; i < n; i++ {
		c.Get("SELECT * FROM t WHERE id = " + strconv.Itoa(i))
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	_, misses, size := c.Stats()
	if size != max || misses != uint64(n) {
		t.Fatalf("size %d misses %d, want %d and %d", size, misses, max, n)
	}
	heapMB := float64(after.HeapAlloc) / (1 << 20)
	t.Logf("%d distinct statements: %d entries, heap %.1f MB (%.1f MB before)",
		n, size, heapMB, float64(before.HeapAlloc)/(1<<20))
	if heapMB > 64 {
		t.Fatalf("heap %.1f MB after %d distinct statements", heapMB, n)
	}
	runtime.KeepAlive(c)
}

func TestCacheConcurrent(t *testing.T) {
	var calls atomic.Int64
	c := newCache(64, defaultMaxBytes, func(key string) *Pattern {
		calls.Add(1)
		return Analyze(key)
	})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				n := (i*7 + g) % 100
				sql := fmt.Sprintf("/* g%d */ SELECT * FROM t%d WHERE id = $1", g, n)
				p, _ := c.Get(sql)
				if want := fmt.Sprintf("t%d", n); len(p.Tables) != 1 || p.Tables[0] != want {
					t.Errorf("Get(%q).Tables = %q, want [%s]", sql, p.Tables, want)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	hits, misses, size := c.Stats()
	if hits+misses != 8*500 || size > 64 || calls.Load() != int64(misses) {
		t.Fatalf("hits %d misses %d size %d analyses %d", hits, misses, size, calls.Load())
	}
}

const benchSQL = "SELECT id, name, email FROM users WHERE tenant_id = $1 AND id = $2"

func BenchmarkCacheHit(b *testing.B) {
	c := NewCache(0)
	c.Get(benchSQL)
	b.ReportAllocs()
	for b.Loop() {
		if _, hit := c.Get(benchSQL); !hit {
			b.Fatal("miss")
		}
	}
}

func BenchmarkCacheHitParallel(b *testing.B) {
	c := NewCache(0)
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = benchSQL + " LIMIT " + strconv.Itoa(i+1)
		c.Get(keys[i])
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, hit := c.Get(keys[i&63]); !hit {
				b.Error("miss")
				return
			}
			i++
		}
	})
}

// BenchmarkCacheHitParallelSameKey is the worst case: every goroutine hits
// one entry of one shard.
func BenchmarkCacheHitParallelSameKey(b *testing.B) {
	c := NewCache(0)
	c.Get(benchSQL)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, hit := c.Get(benchSQL); !hit {
				b.Error("miss")
				return
			}
		}
	})
}

// BenchmarkCacheHitCommented is a hit on a text with a sqlcommenter comment,
// which Key must lex to the end.
func BenchmarkCacheHitCommented(b *testing.B) {
	c := NewCache(0)
	sql := benchSQL + " /*application='api',controller='users',traceparent='00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'*/"
	c.Get(sql)
	b.ReportAllocs()
	for b.Loop() {
		if _, hit := c.Get(sql); !hit {
			b.Fatal("miss")
		}
	}
}

func BenchmarkAnalyze(b *testing.B) {
	for _, sql := range []string{
		benchSQL,
		"SELECT o.id, c.name FROM orders o JOIN customers c ON c.id = o.customer_id WHERE o.status = 'open' AND o.created_at > now() - interval '1 day' ORDER BY o.created_at DESC LIMIT 50",
		"UPDATE accounts SET balance = balance - 10 WHERE id = 42",
		bulkInsert(100), // longer than maxNesting: scanned for its depth before it is parsed
	} {
		b.Run(strconv.Itoa(len(sql)), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Analyze(sql)
			}
		})
	}
}

// BenchmarkCacheMillionDistinct inserts 1,000,000 distinct statements (cheap
// analyzer) and reports the live heap afterwards.
func BenchmarkCacheMillionDistinct(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		c := newCache(0, defaultMaxBytes, cheap)
		for i := 0; i < 1_000_000; i++ {
			c.Get("SELECT * FROM t WHERE id = " + strconv.Itoa(i))
		}
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		b.ReportMetric(float64(m.HeapAlloc)/(1<<20), "heapMB")
		_, _, size := c.Stats()
		b.ReportMetric(float64(size), "entries")
	}
}

func ExampleCache_Get() {
	c := NewCache(0)
	p, hit := c.Get("/* traceparent='00-1-2-01' */ DELETE FROM orders WHERE 1 = 1")
	fmt.Println(p.Kind, p.Summary, p.Normalized, p.UnsafeWrite, hit)
	_, hit = c.Get("DELETE FROM orders WHERE 1 = 1 /* app='billing' */")
	fmt.Println(hit)
	// Output:
	// delete DELETE orders DELETE FROM orders WHERE $1 = $2 true false
	// true
}
