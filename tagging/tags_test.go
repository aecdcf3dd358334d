package tagging

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// pairsOf lists t through its public iterator.
func pairsOf(t Tags) []pair {
	var ps []pair
	for k, v := range t.All() {
		ps = append(ps, pair{k, v})
	}
	return ps
}

func assertTags(tb testing.TB, got Tags, want []pair) {
	tb.Helper()
	if g := pairsOf(got); !slices.Equal(g, want) {
		tb.Errorf("tags = %q, want %q", g, want)
	}
	if got.Len() != len(want) {
		tb.Errorf("Len() = %d, want %d", got.Len(), len(want))
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		name string
		kv   []string
		want []pair
	}{
		{"none", nil, nil},
		{"one", []string{"app", "billing"}, []pair{{"app", "billing"}}},
		{"sorted by key", []string{"z", "1", "a", "2", "m", "3"}, []pair{{"a", "2"}, {"m", "3"}, {"z", "1"}}},
		{"later value wins", []string{"a", "1", "b", "2", "a", "3"}, []pair{{"a", "3"}, {"b", "2"}}},
		{"empty key dropped", []string{"", "x", "a", "1"}, []pair{{"a", "1"}}},
		{"only empty keys", []string{"", "x"}, nil},
		{"empty value kept", []string{"a", ""}, []pair{{"a", ""}}},
		{"case-sensitive keys", []string{"a", "1", "A", "2"}, []pair{{"A", "2"}, {"a", "1"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assertTags(t, New(tt.kv...), tt.want)
		})
	}
}

func TestOddArgumentsPanic(t *testing.T) {
	// A slice, since staticcheck rejects an odd count written out in the call.
	odd := []string{"a", "1", "b"}
	tests := []struct {
		name string
		call func()
		fn   string
	}{
		{"New", func() { New(odd...) }, "New"},
		{"With", func() { With(context.Background(), "a") }, "With"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				msg := fmt.Sprint(recover())
				if !strings.HasPrefix(msg, "tagging: "+tt.fn+" called with an odd number of arguments") {
					t.Errorf("panic = %q, want an odd-arguments message naming %s", msg, tt.fn)
				}
			}()
			tt.call()
		})
	}
}

func TestWith(t *testing.T) {
	base := With(context.Background(), "app", "billing", "tenant", "7")
	tests := []struct {
		name string
		ctx  context.Context
		kv   []string
		want []pair
	}{
		{"onto empty", context.Background(), []string{"b", "2", "a", "1"}, []pair{{"a", "1"}, {"b", "2"}}},
		{"merges, new wins", base, []string{"tenant", "9", "route", "/x"},
			[]pair{{"app", "billing"}, {"route", "/x"}, {"tenant", "9"}}},
		{"no arguments", base, nil, []pair{{"app", "billing"}, {"tenant", "7"}}},
		{"only an empty key", base, []string{"", "v"}, []pair{{"app", "billing"}, {"tenant", "7"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assertTags(t, From(With(tt.ctx, tt.kv...)), tt.want)
		})
	}
	t.Run("parent unchanged", func(t *testing.T) {
		_ = With(base, "app", "other", "x", "y")
		assertTags(t, From(base), []pair{{"app", "billing"}, {"tenant", "7"}})
	})
	t.Run("nothing to add returns ctx itself", func(t *testing.T) {
		if got := With(base); got != base {
			t.Error("With(ctx) returned a new context")
		}
		if got := With(base, "", "v"); got != base {
			t.Error(`With(ctx, "", "v") returned a new context`)
		}
	})
}

func TestFromEmpty(t *testing.T) {
	got := From(context.Background())
	assertTags(t, got, nil)
	if _, ok := got.Get("a"); ok {
		t.Error("Get on empty tags reported a key")
	}
	var zero Tags
	assertTags(t, zero, nil)
}

func TestGet(t *testing.T) {
	tags := New("b", "2", "d", "4", "f", "6", "empty", "")
	tests := []struct {
		key    string
		want   string
		wantOK bool
	}{
		{"b", "2", true},
		{"d", "4", true},
		{"f", "6", true},
		{"empty", "", true},
		{"a", "", false},
		{"c", "", false},
		{"g", "", false},
		{"", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			got, ok := tags.Get(tt.key)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("Get(%q) = %q, %v; want %q, %v", tt.key, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestMerge(t *testing.T) {
	tests := []struct {
		name       string
		base, over Tags
		want       []pair
	}{
		{"both empty", Tags{}, Tags{}, nil},
		{"empty base", Tags{}, New("a", "1"), []pair{{"a", "1"}}},
		{"empty over", New("a", "1"), Tags{}, []pair{{"a", "1"}}},
		{"over wins", New("a", "1", "b", "2"), New("b", "3", "c", "4"),
			[]pair{{"a", "1"}, {"b", "3"}, {"c", "4"}}},
		{"interleaved", New("a", "1", "c", "3", "e", "5"), New("b", "2", "d", "4"),
			[]pair{{"a", "1"}, {"b", "2"}, {"c", "3"}, {"d", "4"}, {"e", "5"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := pairsOf(tt.base)
			assertTags(t, tt.base.Merge(tt.over), tt.want)
			if !slices.Equal(pairsOf(tt.base), before) {
				t.Error("Merge modified its receiver")
			}
		})
	}
}

func TestAllStopsEarly(t *testing.T) {
	var seen []string
	for k := range New("a", "1", "b", "2", "c", "3").All() {
		seen = append(seen, k)
		if k == "b" {
			break
		}
	}
	if !slices.Equal(seen, []string{"a", "b"}) {
		t.Errorf("keys seen = %q, want [a b]", seen)
	}
}

// The driver calls From and All on every statement: neither may allocate.
func TestNoAllocations(t *testing.T) {
	tagged := With(context.Background(), "app", "billing", "route", "/orders/{id}", "tenant", "42")
	var n int
	tests := []struct {
		name string
		f    func()
	}{
		{"From without tags", func() { n += From(context.Background()).Len() }},
		{"From and All", func() {
			for k, v := range From(tagged).All() {
				n += len(k) + len(v)
			}
		}},
		{"Get", func() {
			v, _ := From(tagged).Get("route")
			n += len(v)
		}},
		{"Parse without comment", func() { n += Parse("SELECT * FROM orders WHERE id = $1;").Len() }},
		{"Merge with empty", func() { n += Parse("SELECT 1").Merge(From(tagged)).Len() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if a := testing.AllocsPerRun(100, tt.f); a != 0 {
				t.Errorf("%v allocations per run, want 0", a)
			}
		})
	}
	if n == 0 {
		t.Error("the measured functions saw no tags")
	}
}

func BenchmarkFromAll(b *testing.B) {
	ctx := With(context.Background(), "app", "billing", "route", "/orders/{id}", "tenant", "42")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		iters, n := 0, 0
		for pb.Next() {
			iters++
			for k, v := range From(ctx).All() {
				n += len(k) + len(v)
			}
		}
		if iters > 0 && n == 0 {
			b.Error("no tags seen")
		}
	})
}

func BenchmarkGet(b *testing.B) {
	tags := New("app", "billing", "controller", "export", "route", "/orders/{id}", "tenant", "42")
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := tags.Get("route"); !ok {
			b.Fatal("route missing")
		}
	}
}

func BenchmarkWith(b *testing.B) {
	ctx := With(context.Background(), "app", "billing")
	b.ReportAllocs()
	for b.Loop() {
		_ = With(ctx, "route", "/orders/{id}", "method", "GET")
	}
}

func TestEqual(t *testing.T) {
	a := New("app", "web", "route", "/a")
	cases := []struct {
		name string
		x, y Tags
		want bool
	}{
		{"both empty", Tags{}, New(), true},
		{"same value", a, a, true},
		{"same pairs, other storage", a, New("route", "/a", "app", "web"), true},
		{"other value", a, New("app", "web", "route", "/b"), false},
		{"other key", a, New("app", "web", "router", "/a"), false},
		{"fewer pairs", a, New("app", "web"), false},
		{"empty and not", Tags{}, a, false},
	}
	for _, c := range cases {
		if got := c.x.Equal(c.y); got != c.want {
			t.Errorf("%s: %v.Equal(%v) = %v, want %v", c.name, c.x, c.y, got, c.want)
		}
		if got := c.y.Equal(c.x); got != c.want {
			t.Errorf("%s (reversed): got %v, want %v", c.name, got, c.want)
		}
	}
}
