package cost

import "container/list"

// lru is a bounded table from a 64-bit key to a value V, ordered by recency of [lru.put]: a Go
// map over a container/list. get does not change the order, so readers can share a read lock.
// The zero value is not usable; use newLRU. It is not safe for concurrent use: Model guards it
// with its own lock.
type lru[V any] struct {
	max   int
	byKey map[uint64]*lruEntry[V]
	order list.List // of *lruEntry[V], most recently put first
}

type lruEntry[V any] struct {
	key  uint64
	val  V
	elem *list.Element // the entry's place in order
}

func newLRU[V any](max int) *lru[V] {
	return &lru[V]{max: max, byKey: map[uint64]*lruEntry[V]{}}
}

func (l *lru[V]) len() int { return len(l.byKey) }

// get returns key's value, or nil.
func (l *lru[V]) get(key uint64) (*V, bool) {
	if ent, ok := l.byKey[key]; ok {
		return &ent.val, true
	}
	return nil, false
}

// put makes key the most recent entry and returns its value for the caller to update; a new
// key starts from V's zero value, evicting the least recent entry when the table is full.
func (l *lru[V]) put(key uint64) (v *V, created bool) {
	if ent, ok := l.byKey[key]; ok {
		l.order.MoveToFront(ent.elem)
		return &ent.val, false
	}
	if len(l.byKey) >= l.max {
		last := l.order.Back()
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
