package budget

import (
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
)

// TestOneRequestAdmitsAsMany drives two budgets of one spec through the same random admissions,
// releases and checks: one through reserve, which admits a single request under its budget's
// lock alone, the other through reserveLocked, the all-or-nothing admission of several
// requests, given one. Every denial, warning, reserved cost and the budgets' states must
// agree: the single-request admission is the general one's special case, not a variant.
func TestOneRequestAdmitsAsMany(t *testing.T) {
	specs := []Spec{
		{MaxConcurrent: 3, PerQueryLimit: 0.5, Rate: 1, Burst: 2, WarningThreshold: 0.7},
		{Rate: 0.5, WarningThreshold: 0.9},
		{MaxConcurrent: 2},
		{PerQueryLimit: 0.2, Rate: 2, Burst: 1, MaxKeys: 3},
	}
	for si, spec := range specs {
		rng := rand.New(rand.NewPCG(uint64(si), 7))
		one, many := New(spec), New(spec)
		type held struct{ one, many Request }
		var holds []held
		now := 0.0
		for step := range 2000 {
			now += rng.Float64() * 0.05
			if len(holds) > 0 && rng.IntN(3) == 0 {
				i := rng.IntN(len(holds))
				actual := rng.Float64() * 0.6
				Release(at(now), &holds[i].one, actual)
				Release(at(now), &holds[i].many, actual)
				holds = append(holds[:i], holds[i+1:]...)
				continue
			}
			key := []string{"", "a", "b", "c", "d"}[rng.IntN(5)]
			cost := rng.Float64() * 0.4
			unknown := rng.IntN(4) == 0
			take := rng.IntN(5) != 0
			r1 := []Request{{Budget: one, Key: key, Cost: cost, Unknown: unknown}}
			r2 := []Request{{Budget: many, Key: key, Cost: cost, Unknown: unknown}}
			w1, d1 := reserve(at(now), r1, nil, take)
			w2, d2, _ := reserveLocked(at(now), r2, nil, take, nil)
			if !reflect.DeepEqual(d1, d2) || !reflect.DeepEqual(w1, w2) || r1[0].Cost != r2[0].Cost {
				t.Fatalf("spec %d step %d: one request gave %+v %+v cost %v; the general admission %+v %+v cost %v",
					si, step, d1, w1, r1[0].Cost, d2, w2, r2[0].Cost)
			}
			if take && d1 == nil {
				holds = append(holds, held{r1[0], r2[0]})
			}
		}
		s1, s2 := one.Snapshot(at(now)), many.Snapshot(at(now))
		s1.Decisions, s2.Decisions = Decisions{}, Decisions{}
		// The debts are summed over a map, whose order differs from one walk to the next: equal
		// up to the sum's rounding.
		if math.Abs(s1.Debt-s2.Debt) > 1e-9*max(1, s1.Debt) {
			t.Errorf("spec %d: debts differ at the end: %v against %v", si, s1.Debt, s2.Debt)
		}
		s1.Debt, s2.Debt = 0, 0
		if !reflect.DeepEqual(s1, s2) {
			t.Errorf("spec %d: budgets differ at the end: %+v against %+v", si, s1, s2)
		}
		for _, b := range []*Budget{one, many} {
			if err := invariants(b); err != nil {
				t.Errorf("spec %d: %v", si, err)
			}
		}
	}
}
