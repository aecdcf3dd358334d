package tagging

import (
	"fmt"
	"iter"
	"slices"
	"strings"
)

// Tags is an immutable set of key/value pairs with unique keys.
//
// It is kept as a slice of pairs sorted by key: lookups are a binary search
// and iteration walks the slice, which for the handful of tags a query
// carries is cheaper than a map and needs no allocation. No method modifies
// the slice after construction, so a Tags value may be copied and shared
// between goroutines freely.
//
// The zero value is the empty set.
type Tags struct {
	pairs []pair // sorted by k, keys unique and non-empty; never modified
}

type pair struct{ k, v string }

// New returns tags built from key, value, key, value... arguments, as
// [With] does but without a context; it is handy with [Append].
// A later value of a repeated key wins and pairs with an empty key are
// dropped. An odd number of arguments is a programming error and panics.
func New(kv ...string) Tags {
	t, _ := Tags{}.with("New", kv)
	return t
}

// Get returns the value of key and whether it is present.
func (t Tags) Get(key string) (string, bool) {
	// A hand-written binary search: this runs for every rule lookup.
	lo, hi := 0, len(t.pairs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if t.pairs[m].k < key {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(t.pairs) && t.pairs[lo].k == key {
		return t.pairs[lo].v, true
	}
	return "", false
}

// Len returns the number of pairs.
func (t Tags) Len() int { return len(t.pairs) }

// Equal reports whether t and u hold the same pairs. Tags that share their
// storage (copies of one value) compare in constant time.
func (t Tags) Equal(u Tags) bool {
	if len(t.pairs) != len(u.pairs) {
		return false
	}
	if len(t.pairs) == 0 || &t.pairs[0] == &u.pairs[0] {
		return true
	}
	for i, p := range t.pairs {
		if p != u.pairs[i] {
			return false
		}
	}
	return true
}

// All returns an iterator over the pairs in ascending order of key.
// Ranging over it does not allocate.
func (t Tags) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for _, p := range t.pairs {
			if !yield(p.k, p.v) {
				return
			}
		}
	}
}

// Merge returns the union of t and over; where both have a key, the value in
// over wins. The pgtraffic driver uses it to lay context tags over the tags
// found in a statement's comment.
func (t Tags) Merge(over Tags) Tags {
	return Tags{merge(t.pairs, over.pairs)}
}

// with returns t with the pairs of kv laid over it, and whether kv held any
// pair to lay; fn names the exported caller for the panic message.
func (t Tags) with(fn string, kv []string) (Tags, bool) {
	if len(kv)%2 != 0 {
		// Like slog, treat a mismatched list as a programming error, but
		// loudly: a silently dropped tag would silently skip a budget.
		panic(fmt.Sprintf("tagging: %s called with an odd number of arguments (%d); want key, value pairs", fn, len(kv)))
	}
	add := make([]pair, 0, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		if kv[i] != "" {
			add = append(add, pair{kv[i], kv[i+1]})
		}
	}
	if len(add) == 0 {
		return t, false
	}
	return Tags{merge(t.pairs, normalize(add))}, true
}

// normalize sorts ps by key and keeps only the last pair of each key,
// reusing ps.
func normalize(ps []pair) []pair {
	if len(ps) < 2 {
		return ps
	}
	sorted := true
	for i := 1; i < len(ps); i++ {
		if ps[i-1].k >= ps[i].k {
			sorted = false
			break
		}
	}
	if sorted {
		return ps
	}
	// Stable, so that the last of equal keys is the last given.
	slices.SortStableFunc(ps, func(a, b pair) int { return strings.Compare(a.k, b.k) })
	out := ps[:0]
	for i, p := range ps {
		if i+1 < len(ps) && ps[i+1].k == p.k {
			continue
		}
		out = append(out, p)
	}
	return slices.Clip(out)
}

// merge returns the sorted union of two sorted, duplicate-free slices, taking
// the pair from over on equal keys. It never writes to its inputs, and may
// return one of them when the other is empty.
func merge(base, over []pair) []pair {
	if len(over) == 0 {
		return base
	}
	if len(base) == 0 {
		return over
	}
	out := make([]pair, 0, len(base)+len(over))
	i, j := 0, 0
	for i < len(base) && j < len(over) {
		switch c := strings.Compare(base[i].k, over[j].k); {
		case c < 0:
			out = append(out, base[i])
			i++
		case c > 0:
			out = append(out, over[j])
			j++
		default:
			out = append(out, over[j])
			i++
			j++
		}
	}
	out = append(out, base[i:]...)
	return append(out, over[j:]...)
}
