package engine

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/pattern"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// maxTextLen is the longest statement text the text cache keeps: an entry owns a copy of its
// text, and applications repeat their short statements, not their megabyte-long ones.
const maxTextLen = 2048

// maxSavedTags is the most bytes of context tags (keys and values) an entry's route is saved
// with (textEntry.save): an entry must not keep a large value passed on as a tag (a header,
// a user agent) for as long as its text is cached.
const maxSavedTags = maxTextLen

// textCache maps a statement text, by content, to its pattern and the route it was given:
// applications send the same few texts again and again, so one lookup answers the pattern and,
// for the same context tags under the same rules, the route. It is bounded by entry count; when
// full it starts over (the pattern cache behind it still holds the patterns).
//
// A textCache is safe for concurrent use: one lock guards the map, and an entry's route is an
// immutable value published atomically.
type textCache struct {
	max  int
	hits atomic.Uint64
	mu   sync.RWMutex // protects m
	m    map[string]*textEntry
}

type textEntry struct {
	p     *pattern.Pattern
	route atomic.Pointer[savedRoute]
}

// savedRoute is a route with its own storage and what it was made from: the rules, by their
// generation (a pointer would keep a replaced version of the rules alive as long as the text
// is cached), and the context tags (the built-in tags are the engine's, the pattern's and
// comment's the text's).
type savedRoute struct {
	gen  uint64
	tags tagging.Tags
	rt   route
	// expires is when a rule lapses (its until) after the route was made, which may change
	// it; zero when none will. lapses reports a non-zero expires.
	expires time.Time
	lapses  bool
}

// fresh reports whether s, saved under st, still holds at now.
func (s *savedRoute) fresh(st *compiled, now time.Time) bool {
	return s.gen == st.gen && (!s.lapses || now.Before(s.expires))
}

func newTextCache(max int) *textCache {
	return &textCache{max: max, m: map[string]*textEntry{}}
}

// get returns query's pattern and entry, looking the pattern up in patterns and keeping a copy
// of the text on a miss. A text too long to keep has no entry (nil).
func (c *textCache) get(query string, patterns *pattern.Cache) (*pattern.Pattern, *textEntry) {
	c.mu.RLock()
	t := c.m[query]
	c.mu.RUnlock()
	if t != nil {
		c.hits.Add(1)
		return t.p, t
	}
	p, _ := patterns.Get(query)
	if len(query) > maxTextLen {
		return p, nil
	}
	t = &textEntry{p: p}
	c.mu.Lock()
	if len(c.m) >= c.max {
		clear(c.m)
	}
	// Cloned: the caller's string may be built over a buffer it will reuse (unsafe.String).
	c.m[strings.Clone(query)] = t
	c.mu.Unlock()
	return p, t
}

// routeFor returns the entry's route if it was made under st for equal context tags; a nil
// entry has none.
func (t *textEntry) routeFor(st *compiled, tags tagging.Tags, now time.Time) *route {
	if t == nil {
		return nil
	}
	if s := t.route.Load(); s != nil && s.fresh(st, now) && s.tags.Equal(tags) {
		return &s.rt
	}
	return nil
}

// save keeps a copy of rt, made under st for tags, unless the entry is nil or already holds a
// route made under st: a text sent with ever-changing tags (a tenant per request) then keeps its first
// route rather than allocating one per statement that nothing would reuse. A route for tags
// larger than maxSavedTags is not kept: its text is routed afresh each time.
func (t *textEntry) save(st *compiled, tags tagging.Tags, rt *route, now time.Time) {
	if t == nil {
		return // a text the cache does not keep
	}
	if s := t.route.Load(); s != nil && s.fresh(st, now) {
		return
	}
	if tagsSize(tags) > maxSavedTags {
		return
	}
	s := &savedRoute{gen: st.gen, tags: tags, rt: rt.clone(), expires: st.nextLapse(now)}
	s.lapses = !s.expires.IsZero()
	t.route.Store(s)
}

// tagsSize is the bytes of tags' keys and values.
func tagsSize(tags tagging.Tags) int {
	n := 0
	for k, v := range tags.All() {
		n += len(k) + len(v)
	}
	return n
}
