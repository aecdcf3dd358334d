package budget

import (
	"math"
	"testing"
	"time"
)

// TestHostileCosts: NaN, ±Inf, negative and huge costs and clock steps back and
// forth leave a bucket finite and working: a normal request fits again once the debt drains.
func TestHostileCosts(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 10, MaxConcurrent: 4})
	now := time.Unix(1000, 0)
	for _, c := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -5, 1e300, 5e-324} {
		r := Request{Budget: b, Cost: c}
		if _, d := Admit(now, []Request{r}, nil); d == nil {
			Release(now, &r, c)
		}
		snap := b.Snapshot(now)
		if math.IsNaN(snap.Debt) || math.IsInf(snap.Debt, 0) || snap.Debt < 0 || snap.InFlight != 0 {
			t.Fatalf("after cost %v: %+v", c, snap)
		}
	}
	back := now.Add(-time.Hour) // a clock step back
	r := Request{Budget: b, Cost: 1}
	if _, d := Admit(back, []Request{r}, nil); d != nil {
		t.Fatalf("step back: %+v", d)
	}
	Release(now.Add(time.Hour), &r, 1)
	r = Request{Budget: b, Cost: 1}
	if _, d := Admit(now.Add(2*time.Hour), []Request{r}, nil); d != nil {
		t.Fatalf("after steps: %+v (debt %v)", d, b.Snapshot(now.Add(2*time.Hour)).Debt)
	}
}
