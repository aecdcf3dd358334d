package cost

import (
	"math/bits"
	"math/rand/v2"
)

// lru is a bounded table from a 64-bit key to a value V, ordered by recency of [lru.put].
//
// Nodes live in one slice and link to each other by index, so after the table has grown to its
// bound a put allocates nothing: an eviction reuses the evicted node's slot. get does not change
// the order, so readers can share a lock; only put makes an entry "recent".
//
// The key index is an open-addressing hash table with linear probing rather than a Go map: get
// and put run on every statement that needs a cost, and a map lookup (memhash64, then probing a
// group) took about 90 instructions where a mix of the key, a shift and a probe take about 35.
// A slot holds only a node index; the key is compared in the node, which get reads anyway for
// the value. The table stays at most half full, which keeps probe runs short (about 1.5 slots on
// a hit, 2.5 on a miss) and guarantees an empty slot to end every probe.
//
// The zero value is not usable; use newLRU. It is not safe for concurrent use: the wrappers
// (Model, PlanCache) guard it with their own mutex.
type lru[V any] struct {
	max   int
	nodes []lruNode[V]
	head  int32 // most recently put; nilNode when empty
	tail  int32 // least recently put, the next to be evicted; nilNode when empty

	// slots is the key index: 0 for an empty slot, else 1 + the index of the node holding the
	// key. Its length is a power of two.
	slots []uint32
	shift uint   // 64 - log2(len(slots)): slot keeps the top bits of the mixed key
	seed  uint64 // random per table, so that no fixed set of keys collides in every process
}

type lruNode[V any] struct {
	key        uint64
	val        V
	prev, next int32 // neighbours toward head and toward tail
}

const nilNode = -1

// minLRUSlots is the smallest key index: room for 4 entries at the maximum load of one half.
const minLRUSlots = 8

func newLRU[V any](max int) *lru[V] {
	// The index starts small and grows with use: most processes see far fewer patterns than the
	// bound. 128 slots hold 64 entries, the size the Go map this replaced was created for.
	l := &lru[V]{max: max, head: nilNode, tail: nilNode, seed: rand.Uint64()}
	l.resize(slotsFor(min(max, 64)))
	return l
}

// slotsFor returns the index length that holds n entries at most half full.
func slotsFor(n int) int {
	if n <= minLRUSlots/2 {
		return minLRUSlots
	}
	return 1 << bits.Len(uint(2*n-1)) // the power of two >= 2n
}

// len returns the number of entries: the node slice only grows (an eviction reuses a node), so
// every node holds one.
func (l *lru[V]) len() int { return len(l.nodes) }

// home returns the slot where a probe for key starts. fmix64's first round (an xor-shift and
// a multiply) spreads every key bit into the top bits, which select the slot: sequential keys in
// tests and hash values in production both land evenly.
func (l *lru[V]) home(key uint64) int {
	h := key ^ l.seed
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	return int(h >> (l.shift & 63)) // & 63 spares the check for shifts of 64 or more
}

// find returns the slot holding key and the node index, or nilNode as the node index and the
// empty slot that ended the probe.
func (l *lru[V]) find(key uint64) (slot int, node int32) {
	mask := len(l.slots) - 1
	for s := l.home(key); ; s = (s + 1) & mask {
		v := l.slots[s]
		if v == 0 {
			return s, nilNode
		}
		if l.nodes[v-1].key == key {
			return s, int32(v - 1)
		}
	}
}

// get returns the value stored under key without changing the order. The pointer is valid until
// the next put.
func (l *lru[V]) get(key uint64) (*V, bool) {
	// find's probe, repeated rather than called: get runs once or twice per statement and the
	// call would be a tenth of its cost.
	mask := len(l.slots) - 1
	for s := l.home(key); ; s = (s + 1) & mask {
		v := l.slots[s]
		if v == 0 {
			return nil, false
		}
		if n := &l.nodes[v-1]; n.key == key {
			return &n.val, true
		}
	}
}

// put returns the value stored under key, creating a zero value (evicting the least recently put
// entry when the table is full) if there is none, and makes the entry the most recent. The
// pointer is valid until the next put.
func (l *lru[V]) put(key uint64) (v *V, created bool) {
	// find's probe again, as in get: a put of a known key, once per statement, is the hot case.
	mask := len(l.slots) - 1
	s := l.home(key)
	for ; ; s = (s + 1) & mask {
		j := l.slots[s]
		if j == 0 {
			break
		}
		if i := int32(j - 1); l.nodes[i].key == key {
			l.moveToFront(i)
			return &l.nodes[i].val, false
		}
	}
	return l.insert(key, s), true
}

// insert adds key, which is not in the table, whose probe ended at the empty slot s.
func (l *lru[V]) insert(key uint64, s int) *V {
	var i int32
	if len(l.nodes) < l.max {
		if 2*(len(l.nodes)+1) > len(l.slots) {
			l.resize(2 * len(l.slots))
			s, _ = l.find(key) // the empty slot for key moved
		}
		l.nodes = append(l.nodes, lruNode[V]{})
		i = int32(len(l.nodes) - 1)
	} else {
		i = l.tail
		l.unlink(i)
		l.unindex(i)
		s, _ = l.find(key) // removing the evicted key may have shifted key's empty slot
	}
	l.nodes[i] = lruNode[V]{key: key, prev: nilNode, next: nilNode}
	l.pushFront(i)
	l.slots[s] = uint32(i) + 1
	return &l.nodes[i].val
}

// resize rebuilds the key index with n slots (a power of two, more than twice the entries).
func (l *lru[V]) resize(n int) {
	l.slots = make([]uint32, n)
	l.shift = uint(64 - bits.TrailingZeros(uint(n)))
	for i := range l.nodes {
		s, _ := l.find(l.nodes[i].key)
		l.slots[s] = uint32(i) + 1
	}
}

// unindex removes node i's key from the index. Linear probing cannot leave a hole in a probe
// run, which would end later probes early, so entries after the hole that may not stay behind it
// move back into it (backward-shift deletion, no tombstones).
func (l *lru[V]) unindex(i int32) {
	mask := len(l.slots) - 1
	hole, _ := l.find(l.nodes[i].key)
	for s := (hole + 1) & mask; l.slots[s] != 0; s = (s + 1) & mask {
		// The entry at s may fill the hole if its home is not cyclically within (hole, s]:
		// then its probe passes the hole on the way to s.
		h := l.home(l.nodes[l.slots[s]-1].key)
		if (s-h)&mask >= (s-hole)&mask {
			l.slots[hole] = l.slots[s]
			hole = s
		}
	}
	l.slots[hole] = 0
}

// tailKey returns the key of the least recently put entry, the next to be evicted; the table
// must not be empty.
func (l *lru[V]) tailKey() uint64 { return l.nodes[l.tail].key }

// each calls f for every entry, most recent first. f must not call put.
func (l *lru[V]) each(f func(key uint64, v *V)) {
	for i := l.head; i != nilNode; i = l.nodes[i].next {
		f(l.nodes[i].key, &l.nodes[i].val)
	}
}

// moveToFront makes entry i the most recent. It runs on every put of a known key, so it does
// what unlink and pushFront would do without the checks that cannot fail for an entry that is not
// the head: it has a predecessor, and the list a head.
func (l *lru[V]) moveToFront(i int32) {
	if l.head == i {
		return
	}
	n := &l.nodes[i]
	l.nodes[n.prev].next = n.next
	if n.next != nilNode {
		l.nodes[n.next].prev = n.prev
	} else {
		l.tail = n.prev
	}
	l.nodes[l.head].prev = i
	n.prev, n.next = nilNode, l.head
	l.head = i
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
