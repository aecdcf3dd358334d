package budget

import (
	"testing"
	"time"
)

// TestConcurrencyHintPerKey: under a budget keyed per tenant, a refused statement's RetryAfter
// follows the time its own key's statements hold their slots, not the budget's mean over every
// key: a noisy tenant's 50ms statements beside quiet tenants' sub-millisecond lookups are told
// to come back when one of its own slots frees (25ms over its two slots), not in 1ms, which
// would have it retry twenty times as often. A key with no history yet takes the budget's.
func TestConcurrencyHintPerKey(t *testing.T) {
	b := New(Spec{MaxConcurrent: 2})
	now := 0.0
	for range 50 { // the quiet tenants' lookups
		r := admit1(t, at(now), b, "quiet", 0)
		now += 0.0002
		Release(at(now), r, 0.0002)
	}
	for range 5 { // the noisy tenant's reports, two at a time
		r1, r2 := admit1(t, at(now), b, "noisy", 0), admit1(t, at(now), b, "noisy", 0)
		now += 0.05
		Release(at(now), r1, 0.05)
		Release(at(now), r2, 0.05)
	}
	admit1(t, at(now), b, "noisy", 0)
	admit1(t, at(now), b, "noisy", 0)
	_, d := Admit(at(now), []Request{{Budget: b, Key: "noisy"}}, nil)
	if d == nil || d.RetryAfter < 20*time.Millisecond || d.RetryAfter > 30*time.Millisecond {
		t.Fatalf("the noisy tenant refused: %+v, want a RetryAfter of about 25ms", d)
	}
	admit1(t, at(now), b, "new", 0)
	admit1(t, at(now), b, "new", 0)
	if _, d := Admit(at(now), []Request{{Budget: b, Key: "new"}}, nil); d == nil || d.RetryAfter <= 0 || d.RetryAfter > time.Second {
		t.Fatalf("a key with no history refused: %+v, want the budget's hint", d)
	}
	mustInvariants(t, b)
}
