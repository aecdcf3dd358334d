package cost

import (
	"slices"
	"testing"
)

func lruKeys(l *lru[int]) []uint64 {
	var keys []uint64
	l.each(func(k uint64, _ *int) { keys = append(keys, k) })
	return keys
}

func TestLRU(t *testing.T) {
	tests := []struct {
		name string
		max  int
		puts []uint64
		want []uint64 // most recent first
	}{
		{"empty", 3, nil, nil},
		{"below the bound", 3, []uint64{1, 2}, []uint64{2, 1}},
		{"evicts the least recent", 3, []uint64{1, 2, 3, 4}, []uint64{4, 3, 2}},
		{"a put makes an entry recent", 3, []uint64{1, 2, 3, 1, 4}, []uint64{4, 1, 3}},
		{"re-put of the head", 3, []uint64{1, 2, 2, 3}, []uint64{3, 2, 1}},
		{"re-put of the tail", 3, []uint64{1, 2, 3, 1}, []uint64{1, 3, 2}},
		{"bound of one", 1, []uint64{1, 2, 3}, []uint64{3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLRU[int](tt.max)
			for _, k := range tt.puts {
				v, _ := l.put(k)
				*v++
			}
			if got := lruKeys(l); !slices.Equal(got, tt.want) {
				t.Fatalf("keys = %v, want %v", got, tt.want)
			}
			if l.len() != len(tt.want) {
				t.Fatalf("len = %d, want %d", l.len(), len(tt.want))
			}
			// Walking from the tail must see the same list reversed.
			var back []uint64
			for i := l.tail; i != nilNode; i = l.nodes[i].prev {
				back = append(back, l.nodes[i].key)
			}
			slices.Reverse(back)
			if !slices.Equal(back, tt.want) {
				t.Fatalf("backward keys = %v, want %v", back, tt.want)
			}
		})
	}
}

func TestLRUEvictionResetsValue(t *testing.T) {
	l := newLRU[int](1)
	v, created := l.put(1)
	*v = 7
	if !created {
		t.Fatal("first put did not create")
	}
	if v, created := l.put(1); created || *v != 7 {
		t.Fatalf("re-put = %d, created %v; want 7, false", *v, created)
	}
	v, created = l.put(2)
	if !created || *v != 0 {
		t.Fatalf("put into an evicted slot = %d, created %v; want a fresh zero value", *v, created)
	}
	if _, ok := l.get(1); ok {
		t.Fatal("evicted key still found")
	}
}

func TestLRUPutAllocsAtBound(t *testing.T) {
	l := newLRU[int](100)
	for k := range uint64(1000) {
		l.put(k)
	}
	k := uint64(1000)
	if n := testing.AllocsPerRun(1000, func() { l.put(k); k++ }); n != 0 {
		t.Fatalf("put at the bound allocates %v times, want 0", n)
	}
}
