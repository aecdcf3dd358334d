package budget

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
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
		{"concurrency", Spec{MaxConcurrent: 1}, 1, ReasonConcurrency},
		{"per query limit", Spec{PerQueryLimit: 0.5}, 1, ReasonPerQuery},
		{"bucket", Spec{Rate: 1, Burst: 2}, 1.5, ReasonBudget},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b1 := New(Spec{Rate: 1, Burst: 10, MaxConcurrent: 5})
			b2 := New(tt.second)
			if tt.want == ReasonConcurrency {
				admit1(t, at(0), b2, "k", 0)
			}
			if tt.want == ReasonBudget {
				charge(t, at(0), b2, "k", 1)
			}
			before := b2.Snapshot(at(0))
			_, d := Admit(at(0), []Request{{Budget: b1, Key: "k", Cost: tt.cost}, {Budget: b2, Key: "k", Cost: tt.cost}}, nil)
			if d == nil || d.Index != 1 || d.Reason != tt.want {
				t.Fatalf("denial = %+v, want index 1 reason %s", d, tt.want)
			}
			if s := b1.Snapshot(at(0)); s.Debt != 0 || s.InFlight != 0 || s.Keys != 0 || s.Admitted != 0 || s.Blocked != 0 {
				t.Errorf("budget 1 touched by a denied admission: %+v", s)
			}
			after := b2.Snapshot(at(0))
			if after.Debt != before.Debt || after.InFlight != before.InFlight || after.Blocked != before.Blocked+1 {
				t.Errorf("budget 2 before %+v after %+v: want only Blocked+1", before, after)
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
		{"warn-only never denies", []Request{{Budget: small, Cost: 1, WarnOnly: true}, {Budget: owing, Cost: 1}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if d := Check(at(0), tt.reqs); d == nil || d.Index != tt.wantIndex {
				t.Errorf("Check = %+v, want index %d", d, tt.wantIndex)
			}
		})
	}
	if s := small.Snapshot(at(0)); s.Blocked != 0 {
		t.Errorf("Check counted %d blocks", s.Blocked)
	}
}

func TestTooBigForBurst(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 2})
	_, d := Admit(at(0), []Request{{Budget: b, Cost: 2.5}}, nil)
	want := Denial{Reason: ReasonPerQuery, Limit: "burst_limit=2s"}
	if d == nil || *d != want {
		t.Fatalf("denial = %+v, want %+v", d, want)
	}
	// Two requests for the same key that only together exceed the burst.
	_, d = Admit(at(0), []Request{{Budget: b, Cost: 1.5}, {Budget: b, Cost: 1}}, nil)
	if d == nil || d.Index != 1 || d.Reason != ReasonPerQuery {
		t.Fatalf("denial = %+v, want index 1 %s", d, ReasonPerQuery)
	}
}

func TestDuplicateRequestsAddUp(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 10, MaxConcurrent: 2})
	// Slots: two requests of the same key need two free slots.
	admit1(t, at(0), b, "k", 1)
	if d := Check(at(0), []Request{{Budget: b, Key: "k"}, {Budget: b, Key: "k"}}); d == nil || d.Reason != ReasonConcurrency {
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
			[]Warning{{Reason: ReasonBudget, Fill: 0.8, Limit: "burst_limit=10s"}}},
		{"concurrency", Spec{MaxConcurrent: 1, WarningThreshold: 0.9}, 0, Request{},
			[]Warning{{Reason: ReasonConcurrency, Fill: 1, Limit: "max_concurrent=1"}}},
		{"per query limit", Spec{PerQueryLimit: 2, WarningThreshold: 0.5}, 0, Request{Cost: 1.5},
			[]Warning{{Reason: ReasonPerQuery, Fill: 0.75, Limit: "per_query_limit=2s"}}},
		{"threshold off", Spec{MaxConcurrent: 1}, 0, Request{}, nil},
		{"warn-only over per query limit", Spec{PerQueryLimit: 1}, 0, Request{Cost: 3, WarnOnly: true},
			[]Warning{{Reason: ReasonPerQuery, Fill: 3, Over: true, Limit: "per_query_limit=1s"}}},
		{"warn-only over bucket", Spec{Rate: 1, Burst: 2}, 2, Request{Cost: 1, WarnOnly: true},
			[]Warning{{Reason: ReasonBudget, Fill: 1.5, Over: true, Limit: "burst_limit=2s"}}},
		{"warn-only bigger than burst", Spec{Rate: 1, Burst: 2}, 0, Request{Cost: 3, WarnOnly: true},
			[]Warning{{Reason: ReasonPerQuery, Fill: 1.5, Over: true, Limit: "burst_limit=2s"}}},
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
			if s := b.Snapshot(at(0)); s.Warned != uint64(len(tt.want)) {
				t.Errorf("Warned = %d, want %d", s.Warned, len(tt.want))
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

// TestFitsMatchesCheckOne: fits, admitOne's quick test, passes exactly the requests that
// checkOne passes, over random specs, states, times and costs (zero, negative, NaN, huge and
// at the limits included).
func TestFitsMatchesCheckOne(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	costs := []float64{0, -1, math.NaN(), math.Inf(1), 1e12, 0.5, 1, 2, 3}
	passed, refused := 0, 0
	for i := range 200_000 {
		spec := Spec{MaxKeys: 10}
		if rng.IntN(2) == 0 {
			spec.MaxConcurrent = 1 + rng.IntN(3)
		}
		if rng.IntN(2) == 0 {
			spec.PerQueryLimit = float64(rng.IntN(3)) + 0.5
		}
		if rng.IntN(2) == 0 {
			spec.Rate, spec.Burst = float64(1+rng.IntN(2)), float64(1+rng.IntN(3))
		}
		b := New(spec)
		var s *state
		if rng.IntN(4) > 0 {
			s = &state{debt: rng.Float64() * 4, last: int64(rng.IntN(3e9)), inflight: int32(rng.IntN(4))}
		}
		tm := int64(rng.IntN(4e9))
		cost := costs[rng.IntN(len(costs))]
		switch rng.IntN(4) {
		case 0:
			cost = rng.Float64() * 4
		case 1:
			// Just past the burst limit, within its rounding slack: fits.
			cost = b.spec.Burst * (1 + 5e-13)
		}
		r := Request{Budget: b, Cost: cost}
		_, want := checkOne(b, &r, 0, s, tm, 0, 0)
		if got := b.fits(s, tm, sanitizeCost(cost)); got != want {
			t.Fatalf("case %d: spec %+v state %+v t %d cost %v: fits %v, checkOne %v", i, b.spec, s, tm, cost, got, want)
		}
		if want {
			passed++
		} else {
			refused++
		}
	}
	if passed < 10_000 || refused < 10_000 {
		t.Fatalf("%d passed, %d refused: the cases do not exercise both", passed, refused)
	}
}

// TestAdmitAtMatchesAdmit runs the same random admissions of one and of
// several requests over two budgets on twins: budgets made by New and
// admitted at a time.Time, and budgets made by NewAt and admitted at
// nanoseconds since its epoch. Denials, warnings and snapshots must agree.
func TestAdmitAtMatchesAdmit(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 13))
	epoch := at(-3) // before any admission, unlike New's lazy epoch (the first now seen)
	for round := range 20 {
		specs := [2]Spec{
			{Rate: 1, Burst: 2, MaxConcurrent: 3, MaxKeys: 1 + rng.IntN(4), WarningThreshold: 0.5},
			{Rate: 0.5, Burst: 1, PerQueryLimit: 0.8, MaxKeys: 1 + rng.IntN(4)},
		}
		var byTime, byNanos [2]*Budget
		for i, sp := range specs {
			byTime[i], byNanos[i] = New(sp), NewAt(sp, epoch)
		}
		type held struct{ a, b []Request }
		var holds []held
		now := 0.0
		for step := range 300 {
			now += rng.Float64() * 0.2
			if rng.IntN(3) == 0 && len(holds) > 0 {
				i := rng.IntN(len(holds))
				actual := rng.Float64()
				for j := range holds[i].a {
					Release(at(now), &holds[i].a[j], actual)
					Release(at(now), &holds[i].b[j], actual)
				}
				holds = append(holds[:i], holds[i+1:]...)
			} else {
				n := 1 + rng.IntN(3)
				ra, rb := make([]Request, n), make([]Request, n)
				for j := range n {
					bi, key, cost := rng.IntN(2), strconv.Itoa(rng.IntN(3)), rng.Float64()
					if key == "0" {
						key = ""
					}
					ra[j] = Request{Budget: byTime[bi], Key: key, Cost: cost, WarnOnly: rng.IntN(5) == 0}
					rb[j] = ra[j]
					rb[j].Budget = byNanos[bi]
				}
				wa, da := Admit(at(now), ra, nil)
				wb, db := AdmitAt(int64(at(now).Sub(epoch)), rb, nil)
				if (da == nil) != (db == nil) || da != nil && *da != *db || !slices.Equal(wa, wb) {
					t.Fatalf("round %d step %d: Admit %v %v, AdmitAt %v %v", round, step, da, wa, db, wb)
				}
				if da == nil {
					holds = append(holds, held{ra, rb})
				}
			}
			for i := range byTime {
				if sa, sb := byTime[i].Snapshot(at(now)), byNanos[i].Snapshot(at(now)); sa != sb {
					t.Fatalf("round %d step %d budget %d: %+v, at nanos %+v", round, step, i, sa, sb)
				}
				mustInvariants(t, byNanos[i])
			}
		}
	}
}

// TestAdmitAtNeedsEpoch: AdmitAt of a budget made by New is a programming
// error, reported at once rather than admitted on a meaningless clock.
func TestAdmitAtNeedsEpoch(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "NewAt") {
			t.Errorf("recovered %v, want a panic naming NewAt", r)
		}
	}()
	AdmitAt(0, []Request{{Budget: New(Spec{MaxConcurrent: 1})}}, nil)
}

// TestAdmitOneMatchesMany holds admitOne (Admit of one request, with its
// fused common case) to admitMany, the general path, on twin budgets: the
// same random admissions, releases and reloads, over specs with and without
// each limit and a warning threshold, must give the same denials, warnings
// and snapshots.
func TestAdmitOneMatchesMany(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 19))
	randSpec := func() Spec {
		sp := Spec{MaxKeys: 1 + rng.IntN(4)}
		if rng.IntN(3) > 0 {
			sp.Rate, sp.Burst = float64(rng.IntN(3)), 0.5+2*rng.Float64()
		}
		if rng.IntN(2) == 0 {
			sp.MaxConcurrent = 1 + rng.IntN(3)
		}
		if rng.IntN(3) == 0 {
			sp.PerQueryLimit = 0.3 + rng.Float64()
		}
		if rng.IntN(3) == 0 {
			sp.WarningThreshold = 0.5
		}
		return sp
	}
	for round := range 40 {
		sp := randSpec()
		one, many := New(sp), New(sp)
		var holds [][2]Request
		now := 0.0
		for step := range 400 {
			if rng.IntN(3) > 0 { // else at the same instant: debts add up exactly
				now += rng.Float64() * 0.1
			}
			switch op := rng.IntN(20); {
			case op < 11:
				key := []string{"", "a", "b", "c"}[rng.IntN(4)]
				cost := rng.Float64() * 1.2
				if rng.IntN(4) == 0 {
					cost = sp.Burst / 4 // fills the bucket exactly, at its edge
				} else if rng.IntN(10) == 0 {
					cost = []float64{0, -1, math.NaN(), math.Inf(1)}[rng.IntN(4)]
				}
				warnOnly := rng.IntN(5) == 0
				r1 := []Request{{Budget: one, Key: key, Cost: cost, WarnOnly: warnOnly}}
				r2 := []Request{{Budget: many, Key: key, Cost: cost, WarnOnly: warnOnly}}
				w1, d1 := Admit(at(now), r1, nil)
				w2, d2 := admitMany(&instant{now: at(now)}, r2, nil)
				if (d1 == nil) != (d2 == nil) || d1 != nil && *d1 != *d2 || !slices.Equal(w1, w2) {
					t.Fatalf("round %d step %d (%+v): admitOne %v %v, admitMany %v %v", round, step, sp, d1, w1, d2, w2)
				}
				if d1 == nil {
					holds = append(holds, [2]Request{r1[0], r2[0]})
				}
			case op < 19 && len(holds) > 0:
				i := rng.IntN(len(holds))
				actual := rng.Float64()
				Release(at(now), &holds[i][0], actual)
				Release(at(now), &holds[i][1], actual)
				holds = append(holds[:i], holds[i+1:]...)
			case op == 19:
				sp = randSpec()
				one.SetSpec(at(now), sp)
				many.SetSpec(at(now), sp)
			}
			if s1, s2 := one.Snapshot(at(now)), many.Snapshot(at(now)); s1 != s2 {
				t.Fatalf("round %d step %d: admitOne %+v, admitMany %+v", round, step, s1, s2)
			}
			mustInvariants(t, one)
		}
	}
}
