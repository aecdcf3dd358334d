package pattern

import (
	"hash/maphash"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
)

const (
	// DefaultMaxEntries is the entry bound NewCache uses for maxEntries <= 0.
	DefaultMaxEntries = 10_000
	// defaultMaxBytes bounds the memory the entries account for (key text,
	// normalised text, table names), so that large distinct texts (bulk
	// INSERTs with inline literals) cannot hold gigabytes: 10,000 entries
	// of 1 MiB each would. A text too large for its shard is analysed but
	// not cached.
	defaultMaxBytes = 64 << 20
	// entryOverhead approximates the fixed cost of one entry: the entry, the
	// Pattern, its strings' headers and the map slot.
	entryOverhead = 320
)

// Cache maps statement texts, by [Key], to their shared *Pattern.
//
// It is split into shards (a power of two, chosen from GOMAXPROCS and the
// bound) selected by a cheap hash of the key; each shard is a map plus a
// CLOCK ring under one RWMutex. A hit takes the read lock, sets the entry's
// reference bit (an atomic, written only when it was clear) and allocates
// nothing. A miss analyses the text outside any lock, then inserts it,
// evicting entries whose reference bit is clear; concurrent misses of one key
// may both analyse it, and the first inserted Pattern wins for both.
//
// The cache holds at most maxEntries entries and about 64 MiB of text in
// total. Use [NewCache]; the zero value is not usable. It is safe for
// concurrent use.
type Cache struct {
	shards  []shard
	mask    uint32
	analyze func(key string) *Pattern // Analyze; tests inject a cheap one
}

// shard is one independently locked part of the cache.
type shard struct {
	mu       sync.RWMutex // protects the fields below
	m        map[string]*entry
	ring     []*entry // CLOCK order; the hand sweeps it
	hand     int
	bytes    int
	maxLen   int // entries
	maxBytes int

	hits   atomic.Uint64
	misses atomic.Uint64
	_      [64]byte // keep neighbouring shards' hot words on separate cache lines
}

// entry is one cached pattern.
type entry struct {
	key  string
	p    *Pattern
	cost int
	ref  atomic.Bool // CLOCK's reference bit: set by hits, cleared by the hand
}

// NewCache returns an empty cache bounded to maxEntries entries
// (DefaultMaxEntries when maxEntries <= 0).
func NewCache(maxEntries int) *Cache {
	return newCache(maxEntries, defaultMaxBytes, analyze)
}

func newCache(maxEntries, maxBytes int, fn func(string) *Pattern) *Cache {
	if maxEntries <= 0 {
		maxEntries = DefaultMaxEntries
	}
	n := 1
	// More shards than 4 per CPU buys no parallelism; fewer than 64
	// entries per shard makes CLOCK too coarse.
	for n < 64 && n < 4*runtime.GOMAXPROCS(0) && maxEntries/(2*n) >= 64 {
		n *= 2
	}
	c := &Cache{shards: make([]shard, n), mask: uint32(n - 1), analyze: fn}
	for i := range c.shards {
		s := &c.shards[i]
		s.maxLen = maxEntries / n
		if i < maxEntries%n {
			s.maxLen++
		}
		s.maxBytes = maxBytes / n
		s.m = make(map[string]*entry)
	}
	return c
}

// Get returns the Pattern of sql and whether it came from the cache. It never
// fails: unparsable text has a Pattern too.
func (c *Cache) Get(sql string) (p *Pattern, hit bool) {
	key := Key(sql)
	s := &c.shards[shardHash(key)&c.mask]
	s.mu.RLock()
	e := s.m[key]
	if e != nil {
		if !e.ref.Load() {
			e.ref.Store(true)
		}
		p = e.p
	}
	s.mu.RUnlock()
	if p != nil {
		s.hits.Add(1)
		return p, true
	}
	s.misses.Add(1)
	p = c.analyze(key)
	return s.insert(key, p), false
}

// insert stores p under key unless another goroutine stored one first, and
// returns the stored Pattern (p when the entry is too large to cache).
func (s *shard) insert(key string, p *Pattern) *Pattern {
	cost := entryOverhead + len(key) + len(p.Normalized) + len(p.Summary)
	for _, t := range p.Tables {
		cost += len(t) + 16
	}
	if cost > s.maxBytes || s.maxLen == 0 {
		return p
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.m[key]; e != nil {
		return e.p
	}
	for len(s.ring) > 0 && (len(s.ring) >= s.maxLen || s.bytes+cost > s.maxBytes) {
		s.evict()
	}
	// Clone: key may be a slice of a larger caller string (the comments
	// Key stripped), which the cache must not keep alive.
	e := &entry{key: strings.Clone(key), p: p, cost: cost}
	s.m[e.key] = e
	s.ring = append(s.ring, e)
	s.bytes += cost
	return p
}

// evict removes one entry whose reference bit is clear, clearing set bits as
// the hand passes them (at most one full turn). s.mu must be held.
func (s *shard) evict() {
	for {
		if s.hand >= len(s.ring) {
			s.hand = 0
		}
		e := s.ring[s.hand]
		if e.ref.Load() {
			e.ref.Store(false)
			s.hand++
			continue
		}
		last := len(s.ring) - 1
		s.ring[s.hand] = s.ring[last]
		s.ring[last] = nil
		s.ring = s.ring[:last]
		delete(s.m, e.key)
		s.bytes -= e.cost
		return
	}
}

// Stats returns the hit and miss counts since creation and the number of
// cached entries.
func (c *Cache) Stats() (hits, misses uint64, size int) {
	for i := range c.shards {
		s := &c.shards[i]
		hits += s.hits.Load()
		misses += s.misses.Load()
		s.mu.RLock()
		size += len(s.m)
		s.mu.RUnlock()
	}
	return hits, misses, size
}

// shardSeed seeds the shard hash. The hash covers the whole key: texts that
// differ only in the middle (inline literals between a common prefix and
// suffix) are the common case and must spread over all shards, or the
// cache's effective capacity shrinks to the few shards they land in.
var shardSeed = maphash.MakeSeed()

func shardHash(key string) uint32 {
	h := maphash.String(shardSeed, key)
	return uint32(h ^ h>>32)
}
