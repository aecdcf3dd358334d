package cost

// lru is a bounded table from a 64-bit key to a value V, ordered by recency of [lru.put].
//
// Nodes live in one slice and link to each other by index, so after the table has grown to its
// bound a put allocates nothing: an eviction reuses the evicted node's slot. get does not change
// the order, so readers can share a lock; only put makes an entry "recent".
//
// The zero value is not usable; use newLRU. It is not safe for concurrent use: the wrappers
// (Model, PlanCache) guard it with their own mutex.
type lru[V any] struct {
	max   int
	index map[uint64]int32
	nodes []lruNode[V]
	head  int32 // most recently put; nilNode when empty
	tail  int32 // least recently put, the next to be evicted; nilNode when empty
}

type lruNode[V any] struct {
	key        uint64
	val        V
	prev, next int32 // neighbours toward head and toward tail
}

const nilNode = -1

func newLRU[V any](max int) *lru[V] {
	// The map starts small and grows with use: most processes see far fewer patterns than the bound.
	return &lru[V]{max: max, index: make(map[uint64]int32, min(max, 64)), head: nilNode, tail: nilNode}
}

func (l *lru[V]) len() int { return len(l.index) }

// get returns the value stored under key without changing the order. The pointer is valid until
// the next put.
func (l *lru[V]) get(key uint64) (*V, bool) {
	i, ok := l.index[key]
	if !ok {
		return nil, false
	}
	return &l.nodes[i].val, true
}

// put returns the value stored under key, creating a zero value (evicting the least recently put
// entry when the table is full) if there is none, and makes the entry the most recent. The
// pointer is valid until the next put.
func (l *lru[V]) put(key uint64) (v *V, created bool) {
	if i, ok := l.index[key]; ok {
		l.moveToFront(i)
		return &l.nodes[i].val, false
	}
	var i int32
	if len(l.nodes) < l.max {
		l.nodes = append(l.nodes, lruNode[V]{})
		i = int32(len(l.nodes) - 1)
	} else {
		i = l.tail
		l.unlink(i)
		delete(l.index, l.nodes[i].key)
	}
	l.nodes[i] = lruNode[V]{key: key, prev: nilNode, next: nilNode}
	l.pushFront(i)
	l.index[key] = i
	return &l.nodes[i].val, true
}

// each calls f for every entry, most recent first. f must not call put.
func (l *lru[V]) each(f func(key uint64, v *V)) {
	for i := l.head; i != nilNode; i = l.nodes[i].next {
		f(l.nodes[i].key, &l.nodes[i].val)
	}
}

func (l *lru[V]) moveToFront(i int32) {
	if l.head == i {
		return
	}
	l.unlink(i)
	l.pushFront(i)
}

func (l *lru[V]) unlink(i int32) {
	n := &l.nodes[i]
	if n.prev != nilNode {
		l.nodes[n.prev].next = n.next
	} else {
		l.head = n.next
	}
	if n.next != nilNode {
		l.nodes[n.next].prev = n.prev
	} else {
		l.tail = n.prev
	}
	n.prev, n.next = nilNode, nilNode
}

func (l *lru[V]) pushFront(i int32) {
	n := &l.nodes[i]
	n.prev = nilNode
	n.next = l.head
	if l.head != nilNode {
		l.nodes[l.head].prev = i
	}
	l.head = i
	if l.tail == nilNode {
		l.tail = i
	}
}
