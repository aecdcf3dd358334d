package budget

import (
	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"math"
	"testing"
	"time"
)

func TestAllOrNothing(t *testing.T) {
	tests := []struct {
		name   string
		second Spec
		cost   float64
		want   string
	}{
		{"concurrency", Spec{MaxConcurrent: 1}, 1, vocab.ReasonConcurrency},
		{"per query limit", Spec{PerQueryLimit: 0.5}, 1, vocab.ReasonPerQuery},
		{"bucket", Spec{Rate: 1, Burst: 2}, 1.5, vocab.ReasonBudget},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b1 := New(Spec{Rate: 1, Burst: 10, MaxConcurrent: 5})
			b2 := New(tt.second)
			if tt.want == vocab.ReasonConcurrency {
				admit1(t, at(0), b2, "k", 0)
			}
			if tt.want == vocab.ReasonBudget {
				charge(t, at(0), b2, "k", 1)
			}
			before := b2.Snapshot(at(0))
			_, d := Admit(at(0), []Request{{Budget: b1, Key: "k", Cost: tt.cost}, {Budget: b2, Key: "k", Cost: tt.cost}}, nil)
			if d == nil || d.Index != 1 || d.Reason != tt.want {
				t.Fatalf("denial = %+v, want index 1 reason %s", d, tt.want)
			}
			if s := b1.Snapshot(at(0)); s.Debt != 0 || s.InFlight != 0 || s.Keys != 0 {
				t.Errorf("budget 1 touched by a denied admission: %+v", s)
			}
			after := b2.Snapshot(at(0))
			if after.Debt != before.Debt || after.InFlight != before.InFlight || after.Keys != before.Keys {
				t.Errorf("budget 2 before %+v after %+v: want it untouched", before, after)
			}
		})
	}
}

func TestDenialChoice(t *testing.T) {
	full := New(Spec{MaxConcurrent: 1})
	admit1(t, at(0), full, "", 0)
	owing := New(Spec{Rate: 1, Burst: 1})
	charge(t, at(0), owing, "", 1)
	small := New(Spec{PerQueryLimit: 0.1})
	tests := []struct {
		name      string
		reqs      []Request
		wantIndex int
	}{
		{"never-fits wins", []Request{{Budget: owing, Cost: 1}, {Budget: small, Cost: 1}}, 1},
		{"longest wait wins", []Request{{Budget: full}, {Budget: owing, Cost: 1}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if d := Check(at(0), tt.reqs); d == nil || d.Index != tt.wantIndex {
				t.Errorf("Check = %+v, want index %d", d, tt.wantIndex)
			}
		})
	}
}

func TestTooBigForBurst(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 2})
	_, d := Admit(at(0), []Request{{Budget: b, Cost: 2.5}}, nil)
	want := Denial{Reason: vocab.ReasonPerQuery, Limit: "burst_limit=2s (a predicted 2.5s never fits)"}
	if d == nil || *d != want {
		t.Fatalf("denial = %+v, want %+v", d, want)
	}
	// Two requests for the same key that only together exceed the burst.
	_, d = Admit(at(0), []Request{{Budget: b, Cost: 1.5}, {Budget: b, Cost: 1}}, nil)
	if d == nil || d.Index != 1 || d.Reason != vocab.ReasonPerQuery {
		t.Fatalf("denial = %+v, want index 1 %s", d, vocab.ReasonPerQuery)
	}
}

func TestDuplicateRequestsAddUp(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 10, MaxConcurrent: 2})
	// Slots: two requests of the same key need two free slots.
	admit1(t, at(0), b, "k", 1)
	if d := Check(at(0), []Request{{Budget: b, Key: "k"}, {Budget: b, Key: "k"}}); d == nil || d.Reason != vocab.ReasonConcurrency {
		t.Errorf("two slots with one free: %+v", d)
	}
	// Different keys of one budget are independent, and it is locked once.
	if _, d := Admit(at(0), []Request{{Budget: b, Key: "x", Cost: 4}, {Budget: b, Key: "y", Cost: 4}, {Budget: b, Key: "x", Cost: 5}}, nil); d != nil {
		t.Fatalf("denied: %+v", *d)
	}
	if s := b.Snapshot(at(0)); s.InFlight != 4 || math.Abs(s.Debt-14) > 1e-12 {
		t.Errorf("snapshot %+v, want 4 in flight, debt 14", s)
	}
	mustInvariants(t, b)
}

func TestWarnings(t *testing.T) {
	tests := []struct {
		name string
		spec Spec
		pre  float64 // debt charged first
		req  Request
		want []Warning
	}{
		{"below threshold", Spec{Rate: 1, Burst: 10, WarningThreshold: 0.8}, 0, Request{Cost: 7}, nil},
		{"bucket at threshold", Spec{Rate: 1, Burst: 10, WarningThreshold: 0.8}, 5, Request{Cost: 3},
			[]Warning{{Reason: vocab.ReasonBudget, Fill: 0.8, Limit: "burst_limit=10s"}}},
		{"concurrency", Spec{MaxConcurrent: 1, WarningThreshold: 0.9}, 0, Request{},
			[]Warning{{Reason: vocab.ReasonConcurrency, Fill: 1, Limit: "max_concurrent=1"}}},
		{"per query limit", Spec{PerQueryLimit: 2, WarningThreshold: 0.5}, 0, Request{Cost: 1.5},
			[]Warning{{Reason: vocab.ReasonPerQuery, Fill: 0.75, Limit: "per_query_limit=2s"}}},
		{"threshold off", Spec{MaxConcurrent: 1}, 0, Request{}, nil},
		// An unknown cost reserves up to per_query_limit; the limit judges the guess, as when
		// it refuses, so a cheap guess is not warned about as a full limit.
		{"per query limit, a cheap guess", Spec{Rate: 1, Burst: 10, MaxConcurrent: 4, PerQueryLimit: 1, WarningThreshold: 0.8}, 0,
			Request{Cost: 0.001, Unknown: true}, nil},
		{"per query limit, a costly guess", Spec{Rate: 1, Burst: 10, PerQueryLimit: 1, WarningThreshold: 0.8}, 0,
			Request{Cost: 0.9, Unknown: true}, []Warning{{Reason: vocab.ReasonPerQuery, Fill: 0.9, Limit: "per_query_limit=1s"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := New(tt.spec)
			if tt.pre > 0 {
				charge(t, at(0), b, "", tt.pre)
			}
			tt.req.Budget = b
			got, d := Admit(at(0), []Request{tt.req}, nil)
			if d != nil {
				t.Fatalf("denied: %+v", *d)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("warnings = %+v, want %+v", got, tt.want)
			}
			for i := range got {
				if math.Abs(got[i].Fill-tt.want[i].Fill) > 1e-12 {
					t.Errorf("fill %v, want %v", got[i].Fill, tt.want[i].Fill)
				}
				got[i].Fill = tt.want[i].Fill
				if got[i] != tt.want[i] {
					t.Errorf("warning = %+v, want %+v", got[i], tt.want[i])
				}
			}
			mustInvariants(t, b)
		})
	}
}

func TestWarningIndexes(t *testing.T) {
	quiet := New(Spec{Rate: 1, Burst: 10, WarningThreshold: 0.9})
	loud := New(Spec{MaxConcurrent: 1, WarningThreshold: 0.5})
	buf := make([]Warning, 0, 4)
	got, d := Admit(at(0), []Request{{Budget: quiet, Cost: 1}, {Budget: loud}}, buf)
	if d != nil || len(got) != 1 || got[0].Index != 1 {
		t.Fatalf("warnings %+v denial %+v, want one for index 1", got, d)
	}
	if &got[0] != &buf[:1][0] {
		t.Error("Admit did not append to the caller's slice")
	}
}

func TestTimeGoesBack(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 2})
	charge(t, at(10), b, "", 2)
	_, d := Admit(at(9), []Request{{Budget: b, Cost: 1}}, nil)
	if d == nil || d.RetryAfter != 2*time.Second {
		t.Fatalf("denial %+v, want RetryAfter 2s (1s back to the last read, 1s of draining)", d)
	}
	mustInvariants(t, b)
}

// TestPerQueryLimitJudgesLargest: a request for several statements (a batch's, Cost their sum)
// is judged by per_query_limit at its largest statement's cost, and by the bucket at the sum.
func TestPerQueryLimitJudgesLargest(t *testing.T) {
	b := New(Spec{PerQueryLimit: 2, Rate: 1, Burst: 10})
	if _, d := Admit(at(0), []Request{{Budget: b, Cost: 3, Largest: 1}}, nil); d != nil {
		t.Fatalf("three statements of 1s under a limit of 2s: %+v", *d)
	}
	if _, d := Admit(at(0), []Request{{Budget: b, Cost: 3, Largest: 2.5}}, nil); d == nil || d.Reason != vocab.ReasonPerQuery {
		t.Fatalf("a statement of 2.5s under a limit of 2s: %+v", d)
	}
	if _, d := Admit(at(0), []Request{{Budget: b, Cost: 11, Largest: 1}}, nil); d == nil || d.Reason != vocab.ReasonPerQuery {
		t.Fatalf("11s of statements in a burst of 10s, which never fits: %+v", d)
	}
}
