package cost

import (
	"math"
	"sync"
	"time"
)

// DefaultPlanTTL is how long a cached plan cost stays valid: long enough that a hot pattern is
// explained about once a minute, short enough to follow table growth and fresh statistics.
const DefaultPlanTTL = 60 * time.Second

// PlanCache maps a pattern fingerprint to its most recent planner cost, for explain mode
// pattern (and auto, for patterns that are not volatile).
//
// An entry is valid for the TTL after it was put. The cache is bounded: when full, a put of a new
// fingerprint evicts the entry put longest ago, which is also the first to expire. Time is a
// parameter, so callers and tests choose the clock.
//
// A PlanCache is safe for concurrent use; the zero value is not usable, use [NewPlanCache].
type PlanCache struct {
	ttl     time.Duration
	mu      sync.RWMutex // protects entries
	entries *lru[planEntry]
}

type planEntry struct {
	cost    float64
	expires time.Time // when it was put plus the TTL
}

// NewPlanCache returns a cache of at most max entries ([DefaultMaxPatterns] if max <= 0) that
// keeps each for ttl ([DefaultPlanTTL] if ttl <= 0).
func NewPlanCache(max int, ttl time.Duration) *PlanCache {
	if ttl <= 0 {
		ttl = DefaultPlanTTL
	}
	return &PlanCache{ttl: ttl, entries: newLRU[planEntry](boundOrDefault(max))}
}

// TTL returns how long an entry stays valid.
func (c *PlanCache) TTL() time.Duration { return c.ttl }

// Get returns the plan cost cached for fp if it was put less than the TTL before now. A time
// before the put (a wall-clock step in a caller's clock) counts as fresh.
func (c *PlanCache) Get(now time.Time, fp uint64) (float64, bool) {
	c.mu.RLock()
	e, ok := c.entries.get(fp)
	ok = ok && now.Before(e.expires)
	cost := 0.0
	if ok {
		cost = e.cost
	}
	c.mu.RUnlock() // not deferred: nothing above panics, and this runs per statement
	return cost, ok
}

// Put records that fp was explained at now with plan cost cost. Negative or non-finite costs are
// ignored.
func (c *PlanCache) Put(now time.Time, fp uint64, cost float64) {
	if !(cost >= 0) || math.IsInf(cost, 0) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, _ := c.entries.put(fp)
	e.cost, e.expires = cost, now.Add(c.ttl)
}

// Len returns the number of entries, expired ones included.
func (c *PlanCache) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.entries.len()
}
