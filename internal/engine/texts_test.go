package engine

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestTextCacheBounded: distinct texts beyond the bound start the cache over rather than grow it,
// and statements keep being decided right.
func TestTextCacheBounded(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 100}
rules:
  - {budget: a, match: {app: x}}
`, func(o *Options) { o.PatternCacheSize = 50 })
	ctx := tagging.With(context.Background(), "app", "x")
	for i := range 500 {
		if err := run(e, clk, ctx, fmt.Sprintf("select %d from t%d", i, i%7), 0); err != nil {
			t.Fatal(err)
		}
		e.texts.mu.RLock()
		n := len(e.texts.m)
		e.texts.mu.RUnlock()
		if n > 50 {
			t.Fatalf("after %d texts the cache holds %d, bound 50", i+1, n)
		}
	}
	if bs := e.Budgets()[0]; bs.Decisions.Admitted != 500 || bs.InFlight != 0 {
		t.Fatalf("budget %+v, want 500 admitted, none in flight", bs)
	}
}

// TestLongTextAllocatesNothing: a text too long for the text cache is routed afresh each time,
// without allocating a route nothing would reuse.
func TestLongTextAllocatesNothing(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 100}
rules:
  - {budget: a, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	q := "select 1 from t where " + strings.Repeat("a = 1 and ", maxTextLen/10) + "true"
	x := new(Exec) // reused, as a connection reuses its own
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := e.Begin(ctx, x, nil, q, nil); err != nil {
			t.Fatal(err)
		}
		x.Finish(ctx, nil)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per statement of a long text, want 0", allocs)
	}
}

// TestTextCacheKeepsNoLargeTags: a cached text's route is saved with the context tags it was
// made for, so a text first sent with large tag values (a header passed on as a tag) is routed
// afresh each time rather than keep the values as long as the text is cached: an entry's size
// stays bounded by the text's, whatever its tags.
func TestTextCacheKeepsNoLargeTags(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 100}
rules:
  - {budget: a, match: {app: x}}
`)
	large := strings.Repeat("u", 32<<10)
	for _, tc := range []struct {
		name  string
		ctx   context.Context
		saved bool
	}{
		{"small", tagging.With(context.Background(), "app", "x", "user_agent", "curl"), true},
		{"large value", tagging.With(context.Background(), "app", "x", "user_agent", large), false},
		{"large key", tagging.With(context.Background(), "app", "x", large, "1"), false},
	} {
		q := "select 1 from t where k = $1 -- " + tc.name
		x := new(Exec)
		if _, err := e.Begin(tc.ctx, x, nil, q, []any{1}); err != nil {
			t.Fatal(err)
		}
		x.Finish(tc.ctx, nil)
		if bs := e.Budgets()[0]; bs.InFlight != 0 {
			t.Fatalf("%s: %d in flight after Finish", tc.name, bs.InFlight)
		}
		e.texts.mu.RLock()
		entry := e.texts.m[q]
		e.texts.mu.RUnlock()
		if entry == nil {
			t.Fatalf("%s: text not cached", tc.name)
		}
		if saved := entry.route.Load() != nil; saved != tc.saved {
			t.Errorf("%s: route saved %v, want %v", tc.name, saved, tc.saved)
		}
	}
}
