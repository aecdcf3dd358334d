package budget

import (
	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"math"
	"testing"
	"time"
)

func TestNormalize(t *testing.T) {
	tests := []struct {
		name string
		in   Spec
		want Spec
	}{
		{"zero is unlimited", Spec{}, Spec{MaxKeys: DefaultMaxKeys}},
		{"negatives and NaN are off", Spec{MaxConcurrent: -1, PerQueryLimit: math.NaN(), Rate: -2, Burst: 5, WarningThreshold: -0.5, MaxKeys: -3},
			Spec{MaxKeys: DefaultMaxKeys}},
		{"burst defaults to one second of rate", Spec{Rate: 2}, Spec{Rate: 2, Burst: 2, MaxKeys: DefaultMaxKeys}},
		{"infinite rate is no bucket", Spec{Rate: math.Inf(1), Burst: 3}, Spec{MaxKeys: DefaultMaxKeys}},
		{"threshold above one is off", Spec{WarningThreshold: 1.5}, Spec{MaxKeys: DefaultMaxKeys}},
		{"valid spec kept", Spec{MaxConcurrent: 4, PerQueryLimit: 2, Rate: 2, Burst: 10, WarningThreshold: 0.8, MaxKeys: 7},
			Spec{MaxConcurrent: 4, PerQueryLimit: 2, Rate: 2, Burst: 10, WarningThreshold: 0.8, MaxKeys: 7}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := New(tt.in).Snapshot(time.Time{}).Spec; got != tt.want {
				t.Errorf("Spec = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestLimitText(t *testing.T) {
	got := newLimitText(Spec{MaxConcurrent: 4, PerQueryLimit: 0.25, Burst: 10})
	want := limitText{concurrency: "max_concurrent=4", perQuery: "per_query_limit=250ms", burst: "burst_limit=10s"}
	if got != want {
		t.Errorf("newLimitText = %+v, want %+v", got, want)
	}
}

func TestDrain(t *testing.T) {
	tests := []struct {
		name     string
		rate     float64
		cost     float64
		readAt   float64
		wantDebt float64
	}{
		{"at once", 1, 4, 0, 4},
		{"one second", 1, 4, 1, 3},
		{"half rate", 0.5, 4, 2, 3},
		{"exactly empty", 2, 4, 2, 0},
		{"never negative", 1, 4, 100, 0},
		{"time going back drains nothing", 1, 4, -5, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := New(Spec{Rate: tt.rate, Burst: 10})
			charge(t, at(0), b, "", tt.cost)
			if got := b.Snapshot(at(tt.readAt)).Debt; math.Abs(got-tt.wantDebt) > 1e-12 {
				t.Errorf("debt at %vs = %v, want %v", tt.readAt, got, tt.wantDebt)
			}
			mustInvariants(t, b)
		})
	}
}

func TestBurst(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 10})
	for i := range 10 {
		if _, d := Admit(at(0), []Request{{Budget: b, Cost: 1}}, nil); d != nil {
			t.Fatalf("query %d denied within burst: %+v", i, *d)
		}
	}
	_, d := Admit(at(0), []Request{{Budget: b, Cost: 1}}, nil)
	if d == nil {
		t.Fatal("11th second of debt admitted past burst_limit=10s")
	}
	want := Denial{Index: 0, Reason: vocab.ReasonBudget, RetryAfter: time.Second, Limit: "burst_limit=10s"}
	if *d != want {
		t.Errorf("denial = %+v, want %+v", *d, want)
	}
	if s := b.Snapshot(at(0)); s.InFlight != 10 || s.Debt != 10 {
		t.Errorf("snapshot = %+v, want 10 in flight, 10s of debt", s)
	}
}

// TestShare offers far more work than the share allows and checks that what
// is admitted over a long window is share × cores × window + burst.
func TestShare(t *testing.T) {
	tests := []struct {
		name        string
		rate, burst float64
		cost        float64
	}{
		{"quarter of 8 cores", 0.25 * 8, 10, 0.5},
		{"5% of one core", 0.05, 0.05, 0.01},
		{"whole core", 1, 3, 0.1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := New(Spec{Rate: tt.rate, Burst: tt.burst})
			const window, step = 20.0, 0.001 // demand: cost every millisecond
			var admitted float64
			for i := 0; float64(i)*step < window; i++ {
				now := at(float64(i) * step)
				if _, d := Admit(now, []Request{{Budget: b, Cost: tt.cost}}, nil); d == nil {
					Release(now, &Request{Budget: b, Key: "", Cost: tt.cost}, tt.cost)
					admitted += tt.cost
				}
			}
			want := tt.rate*window + tt.burst
			if math.Abs(admitted-want) > tt.cost+1e-9 {
				t.Errorf("admitted %v execution seconds in %vs, want %v ± %v", admitted, window, want, tt.cost)
			}
		})
	}
}

func TestRetryAfterExact(t *testing.T) {
	tests := []struct {
		name        string
		rate, burst float64
		debt, cost  float64
		elapsed     float64 // between charging debt and asking
	}{
		{"whole seconds", 1, 10, 10, 1, 0},
		{"odd rate", 0.3, 1, 1, 0.7, 0.1},
		{"third", 1.0 / 3, 2, 2, 1.5, 0.25},
		{"fast drain", 7, 5, 5, 4.9, 0.001},
		{"tiny cost", 0.05, 0.05, 0.05, 0.0001, 0},
		{"cost equals burst", 2, 4, 1, 4, 0.2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := New(Spec{Rate: tt.rate, Burst: tt.burst})
			charge(t, at(0), b, "k", tt.debt)
			now := at(tt.elapsed)
			req := []Request{{Budget: b, Key: "k", Cost: tt.cost}}
			_, d := Admit(now, req, nil)
			if d == nil || d.Reason != vocab.ReasonBudget {
				t.Fatalf("Admit = %+v, want a budget denial", d)
			}
			ideal := (tt.debt - tt.rate*tt.elapsed + tt.cost - tt.burst) / tt.rate
			if got := d.RetryAfter.Seconds(); math.Abs(got-ideal) > 1e-6 {
				t.Errorf("RetryAfter = %v, want about %vs", d.RetryAfter, ideal)
			}
			for _, early := range []time.Duration{time.Millisecond, time.Nanosecond} {
				if Check(now.Add(d.RetryAfter-early), req) == nil {
					t.Errorf("admitted %v before RetryAfter", early)
				}
			}
			if _, d2 := Admit(now.Add(d.RetryAfter), req, nil); d2 != nil {
				t.Errorf("denied at now+RetryAfter: %+v", *d2)
			}
			mustInvariants(t, b)
		})
	}
}

func TestTrueUp(t *testing.T) {
	tests := []struct {
		name             string
		prior            float64 // debt left before the query
		reserved, actual float64
		releaseAt        float64
		want             float64
	}{
		{"exact", 0, 2, 2, 0, 2},
		{"ran longer adds debt", 0, 2, 5, 0, 5},
		{"ran shorter refunds", 0, 2, 0.5, 0, 0.5},
		{"refund never below zero", 1, 2, 0, 0, 1},
		{"drains during the query", 0, 2, 3, 1, 2},
		{"refund after draining clamps", 0, 2, 0, 1.5, 0},
		{"NaN actual counts as zero", 0, 2, math.NaN(), 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := New(Spec{Rate: 1, Burst: 10})
			if tt.prior > 0 {
				charge(t, at(0), b, "", tt.prior)
			}
			admit1(t, at(0), b, "", tt.reserved)
			Release(at(tt.releaseAt), &Request{Budget: b, Key: "", Cost: tt.reserved}, tt.actual)
			s := b.Snapshot(at(tt.releaseAt))
			if math.Abs(s.Debt-tt.want) > 1e-12 || s.InFlight != 0 {
				t.Errorf("debt %v in flight %d, want %v and 0", s.Debt, s.InFlight, tt.want)
			}
			mustInvariants(t, b)
		})
	}
}

func TestConcurrencySlots(t *testing.T) {
	b := New(Spec{MaxConcurrent: 2})
	first := admit1(t, at(0), b, "a", 0)
	admit1(t, at(0), b, "a", 0)
	_, d := Admit(at(0), []Request{{Budget: b, Key: "a"}}, nil)
	want := Denial{Reason: vocab.ReasonConcurrency, RetryAfter: defaultHold, Limit: "max_concurrent=2"}
	if d == nil || *d != want {
		t.Fatalf("third slot: denial %+v, want %+v", d, want)
	}
	admit1(t, at(0), b, "b", 0) // another key has its own slots
	Release(at(0.4), first, 0.4)
	admit1(t, at(0.4), b, "a", 0)
	// The hint follows the mean hold time spread over the slots.
	_, d = Admit(at(0.4), []Request{{Budget: b, Key: "a"}}, nil)
	if d == nil || d.RetryAfter != 200*time.Millisecond {
		t.Fatalf("hint after one 0.4s hold: %+v, want 200ms", d)
	}
	if s := b.Snapshot(at(1)); s.InFlight != 3 || s.Keys != 2 {
		t.Errorf("snapshot = %+v", s)
	}
	mustInvariants(t, b)
}

func TestReleaseNotAdmitted(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 10, MaxConcurrent: 1})
	Release(at(0), &Request{Budget: b, Key: "never", Cost: 1}, 5) // unknown key
	charge(t, at(0), b, "k", 3)
	Release(at(0), &Request{Budget: b, Key: "k", Cost: 1}, 5) // known key, nothing in flight
	s := b.Snapshot(at(0))
	if s.Debt != 3 || s.InFlight != 0 || s.Keys != 1 {
		t.Errorf("after stray releases: %+v, want debt 3, none in flight, 1 key", s)
	}
	admit1(t, at(0), b, "k", 1) // the slot still works
	mustInvariants(t, b)
}

func TestSetSpecKeepsState(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 10, MaxConcurrent: 2})
	charge(t, at(0), b, "a", 6)
	admit1(t, at(0), b, "b", 1)
	// At 2s debt a=4 (drained at 1/s); from then on it drains at 0.5/s.
	b.SetSpec(at(2), Spec{Rate: 0.5, Burst: 5, MaxConcurrent: 1})
	if s := b.Snapshot(at(4)); math.Abs(s.MaxDebt-3) > 1e-12 || s.InFlight != 1 || s.Keys != 2 {
		t.Fatalf("after reload: %+v, want max debt 3, 1 in flight, 2 keys", s)
	}
	// b's slot survives the reload and counts against the new limit.
	if _, d := Admit(at(4), []Request{{Budget: b, Key: "b"}}, nil); d == nil || d.Reason != vocab.ReasonConcurrency {
		t.Errorf("b over new max_concurrent=1: %+v", d)
	}
	Release(at(4), &Request{Budget: b, Key: "b", Cost: 1}, 1)
	mustInvariants(t, b)
	// A smaller MaxKeys evicts down to the bound, soonest-empty first (b).
	b.SetSpec(at(4), Spec{Rate: 0.5, Burst: 5, MaxKeys: 1})
	if _, ok := b.keys.byKey["a"]; !ok || len(b.keys.byKey) != 1 {
		t.Errorf("keys after shrink: %d, a kept: %v", len(b.keys.byKey), ok)
	}
	// Removing the bucket forgets debt.
	b.SetSpec(at(4), Spec{MaxKeys: 1})
	if s := b.Snapshot(at(4)); s.Debt != 0 {
		t.Errorf("debt without a bucket = %v", s.Debt)
	}
	mustInvariants(t, b)
}

// TestSetSpecKeylessFolds: a reload that drops a budget's per (Keyless) folds every key's slots
// and debt into the empty key's, so that its max_concurrent holds for what already runs, and a
// release of a request admitted under an old key gives its slot back there.
func TestSetSpecKeylessFolds(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 10, MaxConcurrent: 1})
	admit1(t, at(0), b, "t1", 2)
	admit1(t, at(0), b, "t2", 3)
	b.SetSpec(at(1), Spec{Rate: 1, Burst: 10, MaxConcurrent: 1, Keyless: true})
	if s := b.Snapshot(at(1)); s.InFlight != 2 || s.Keys != 1 || math.Abs(s.Debt-3) > 1e-12 {
		t.Fatalf("after dropping per: %+v, want 2 in flight, 1 key, debt 3 (5 drained by 2)", s)
	}
	if _, d := Admit(at(1), []Request{{Budget: b, Key: "t3"}}, nil); d == nil || d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("a third statement with two of max_concurrent=1 running: %+v, want a refusal for concurrency", d)
	}
	Release(at(1), &Request{Budget: b, Key: "t1", Cost: 2}, 2)
	Release(at(1), &Request{Budget: b, Key: "t2", Cost: 3}, 3)
	if s := b.Snapshot(at(1)); s.InFlight != 0 {
		t.Fatalf("after the old keys' releases: %d in flight, want 0", s.InFlight)
	}
	admit1(t, at(1), b, "", 1)
	mustInvariants(t, b)
}

// TestRetryAfterOfADebtOfCenturies: a rate near zero (server_share: 0.000000000001, which the
// rules accept) drains a debt of a second in centuries; a denial then says so at once, with
// the longest wait the bucket computes, rather than search for the instant (and hold the
// budget's lock) forever.
func TestRetryAfterOfADebtOfCenturies(t *testing.T) {
	b := New(Spec{Rate: 1e-12, Burst: 2})
	charge(t, at(0), b, "k", 1.3)
	req := []Request{{Budget: b, Key: "k", Cost: 1}}
	done := make(chan *Denial, 1)
	go func() {
		_, d := Admit(at(1), req, nil)
		done <- d
	}()
	select {
	case d := <-done:
		if d == nil || d.Reason != vocab.ReasonBudget || d.RetryAfter != time.Duration(math.MaxInt64/4) {
			t.Errorf("Admit = %+v, want a budget denial with RetryAfter %v", d, time.Duration(math.MaxInt64/4))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Admit has not returned after 10s: RetryAfter searches forever")
	}
}
