package cost

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
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

// TestLRUKeepsWhatIsRead: an entry that is read (get) but not written survives a round of new
// keys, each eviction giving it a second chance, while one neither read nor written is evicted:
// a pattern refused for its cost is read at each of its statements and never written.
func TestLRUKeepsWhatIsRead(t *testing.T) {
	l := newLRU[int](4)
	l.put(1) // read throughout
	l.put(2) // left alone
	for k := uint64(10); k < 30; k++ {
		if _, ok := l.get(1); !ok {
			t.Fatalf("after %d new keys: the entry read at every step was evicted", k-10)
		}
		l.put(k)
	}
	if _, ok := l.get(2); ok {
		t.Fatal("the entry nobody read survived 20 new keys in a table of 4")
	}
}

// TestLRURandomized runs random puts and gets against a plain reference (a recency-ordered slice,
// a map and the used marks) on bounds from one entry to a thousand.
func TestLRURandomized(t *testing.T) {
	for _, tt := range []struct{ max, keys int }{{1, 4}, {2, 5}, {3, 8}, {4, 10}, {7, 30}, {64, 200}, {1000, 3000}} {
		l := newLRU[int](tt.max)
		var order []uint64 // most recent first
		vals := map[uint64]int{}
		used := map[uint64]bool{}
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
				if ok {
					used[key] = true
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
				used[key] = false
			} else if len(order) == tt.max {
				for last := order[len(order)-1]; used[last]; last = order[len(order)-1] {
					used[last] = false // a second chance
					order = slices.Insert(order[:len(order)-1], 0, last)
				}
				delete(vals, order[len(order)-1])
				delete(used, order[len(order)-1])
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

// TestModelKeepsHotPatternsBesideChurn: a process runs 20 hot patterns, each read (Predict) at
// every statement but trained only once in sixteen as a warm cheap pattern is, beside a stream
// of patterns seen once (each explained: PutPlan, read, trained), in a table of 50. Each hot
// pattern is read once in every 20 new patterns, which the 30 places the hot ones leave hold:
// they keep their cached plans, as in a table ordered by use. Ordered by writes alone, a hot
// pattern trained rarely fell behind the patterns seen once, was dropped and explained again.
func TestModelKeepsHotPatternsBesideChurn(t *testing.T) {
	m := NewModel(50)
	now := time.Unix(1e9, 0)
	for hot := range uint64(20) {
		m.PutPlan(now, hot, 10)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	lost := 0
	for i := range 3000 {
		if i%2 == 0 { // a pattern seen once
			fp := 1000 + uint64(i)
			m.Predict(now, fp, math.NaN())
			m.PutPlan(now, fp, 10)
			m.Predict(now, fp, math.NaN())
			m.Observe(fp, "", 10, 0.001, true, 1)
			continue
		}
		hot := uint64(i/2) % 20
		if r := m.Predict(now, hot, math.NaN()); !r.Cached {
			lost++
			m.PutPlan(now, hot, 10) // explained again
		}
		if rng.IntN(16) == 0 {
			m.Observe(hot, "", 10, 0.001, false, 16)
		}
	}
	if lost > 0 {
		t.Errorf("the hot patterns lost their cached plans %d times in 1,500 statements beside 1,500 patterns seen once", lost)
	}
}
