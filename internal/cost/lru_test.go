package cost

import (
	"math/rand/v2"
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

// TestLRURandomized runs random puts and gets against a plain reference (a recency-ordered slice
// and a map) on bounds from one entry to a thousand.
func TestLRURandomized(t *testing.T) {
	for _, tt := range []struct{ max, keys int }{{1, 4}, {2, 5}, {3, 8}, {4, 10}, {7, 30}, {64, 200}, {1000, 3000}} {
		l := newLRU[int](tt.max)
		var order []uint64 // most recent first
		vals := map[uint64]int{}
		rng := rand.New(rand.NewPCG(uint64(tt.max), 17))
		for step := range 20_000 {
			// Keys far apart in value as well as neighbours: fingerprints are hashes.
			key := uint64(rng.IntN(tt.keys))
			if rng.IntN(2) == 0 {
				key *= 0x9e3779b97f4a7c15
			}
			if rng.IntN(3) == 0 {
				got, ok := l.get(key)
				want, wantOK := vals[key]
				if ok != wantOK || ok && *got != want {
					t.Fatalf("max %d step %d: get(%d) found %v, want %v (%d)", tt.max, step, key, ok, wantOK, want)
				}
				continue
			}
			v, created := l.put(key)
			_, existed := vals[key]
			if created == existed {
				t.Fatalf("max %d step %d: put(%d) created %v, key existed %v", tt.max, step, key, created, existed)
			}
			if existed {
				order = slices.DeleteFunc(order, func(k uint64) bool { return k == key })
			} else if len(order) == tt.max {
				delete(vals, order[len(order)-1])
				order = order[:len(order)-1]
			}
			if created && *v != 0 {
				t.Fatalf("max %d step %d: put(%d) created %d, want a zero value", tt.max, step, key, *v)
			}
			*v++
			vals[key]++
			order = slices.Insert(order, 0, key)
			if got := lruKeys(l); !slices.Equal(got, order) {
				t.Fatalf("max %d step %d: keys %v, want %v", tt.max, step, got, order)
			}
		}
	}
}
