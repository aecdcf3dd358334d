package cost

import (
	"container/list"
	"sync/atomic"
)

// lru is a bounded table from a 64-bit key to a value V, ordered by recency of [lru.put]: a Go
// map over a container/list. get does not change the order, so readers can share a read lock;
// it marks the entry used instead, and eviction gives a used entry a second chance (CLOCK's
// reference bit, as the pattern cache keeps its texts): it goes to the front, unmarked, and the
// next least recent is looked at. So a pattern that is read at every statement but rarely
// written (a cheap one trains once in sixteen; one refused for its cost never runs) stays while
// it is read, rather than being dropped behind patterns seen once, its learned cost and refusal
// forgotten. The zero value is not usable; use newLRU. Model guards it with its own lock: put
// and each need it exclusively, get shared.
type lru[V any] struct {
	max   int
	byKey map[uint64]*lruEntry[V]
	order list.List // of *lruEntry[V], most recently put (or passed over) first
}

type lruEntry[V any] struct {
	key  uint64
	val  V
	elem *list.Element // the entry's place in order
	// used: got since it was last put or passed over for eviction. Set under the shared lock, by
	// several readers at once: an atomic, written only when it was clear.
	used atomic.Bool
}

func newLRU[V any](max int) *lru[V] {
	return &lru[V]{max: max, byKey: map[uint64]*lruEntry[V]{}}
}

func (l *lru[V]) len() int { return len(l.byKey) }

// get returns key's value, or nil, and marks it used.
func (l *lru[V]) get(key uint64) (*V, bool) {
	if ent, ok := l.byKey[key]; ok {
		if !ent.used.Load() {
			ent.used.Store(true)
		}
		return &ent.val, true
	}
	return nil, false
}

// put makes key the most recent entry and returns its value for the caller to update; a new
// key starts from V's zero value, evicting the least recent entry when the table is full.
func (l *lru[V]) put(key uint64) (v *V, created bool) {
	if ent, ok := l.byKey[key]; ok {
		l.order.MoveToFront(ent.elem)
		ent.used.Store(false) // recent by this put: a read from now on is a new one
		return &ent.val, false
	}
	if len(l.byKey) >= l.max {
		// Each pass unmarks an entry, so one that finds none unmarked ends within a round.
		last := l.order.Back()
		for last.Value.(*lruEntry[V]).used.Swap(false) {
			l.order.MoveToFront(last)
			last = l.order.Back()
		}
		delete(l.byKey, last.Value.(*lruEntry[V]).key)
		l.order.Remove(last)
	}
	ent := &lruEntry[V]{key: key}
	ent.elem = l.order.PushFront(ent)
	l.byKey[key] = ent
	return &ent.val, true
}

// each calls f for every entry, most recent first.
func (l *lru[V]) each(f func(key uint64, v *V)) {
	for e := l.order.Front(); e != nil; e = e.Next() {
		ent := e.Value.(*lruEntry[V])
		f(ent.key, &ent.val)
	}
}
