package budget

import (
	"fmt"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// TestShareDelivered: under sustained demand a budget throttles but does not
// starve. Workers that retry when told (RetryAfter) get at least 90% of the
// drain rate (share × cores) in execution seconds, whether the predictions
// are exact, too high or too low, as long as each fits in the burst.
func TestShareDelivered(t *testing.T) {
	tests := []struct {
		rate, burst       float64
		maxConcurrent     int
		workers           int
		predicted, actual float64
	}{
		{rate: 0.3, burst: 0.5, maxConcurrent: 1, workers: 8, predicted: 0.4, actual: 0.4},
		{rate: 0.3, burst: 0.5, maxConcurrent: 1, workers: 8, predicted: 0.45, actual: 0.1},
		{rate: 0.3, burst: 0.5, maxConcurrent: 1, workers: 8, predicted: 0.1, actual: 0.9},
		{rate: 0.15, burst: 2, maxConcurrent: 0, workers: 4, predicted: 0.3, actual: 0.25},
		{rate: 2, burst: 1, maxConcurrent: 4, workers: 16, predicted: 0.02, actual: 0.03},
	}
	for _, tt := range tests {
		name := fmt.Sprintf("rate %g burst %g max %d predicted %g actual %g", tt.rate, tt.burst, tt.maxConcurrent, tt.predicted, tt.actual)
		t.Run(name, func(t *testing.T) {
			b := New(Spec{Rate: tt.rate, Burst: tt.burst, MaxConcurrent: tt.maxConcurrent})
			const horizon = 600 * time.Second
			next := make([]time.Duration, tt.workers) // when each worker acts next: try, or finish
			running := make([]bool, tt.workers)
			delivered := 0.0
			for {
				w := 0
				for i := range next {
					if next[i] < next[w] {
						w = i
					}
				}
				now := next[w]
				if now >= horizon {
					break
				}
				req := Request{Budget: b, Cost: tt.predicted}
				if running[w] {
					Release(t0.Add(now), &req, tt.actual)
					running[w] = false
					delivered += tt.actual
					continue
				}
				if _, d := Admit(t0.Add(now), []Request{req}, nil); d != nil {
					if d.Reason == vocab.ReasonPerQuery {
						t.Fatalf("refused as never fitting: %+v", d)
					}
					next[w] = now + max(d.RetryAfter, time.Millisecond)
					continue
				}
				running[w] = true
				next[w] = now + time.Duration(tt.actual*1e9)
			}
			want := tt.rate * horizon.Seconds()
			if delivered < 0.9*want {
				t.Errorf("delivered %.1f execution seconds in %v, want >= 90%% of %.1f", delivered, horizon, want)
			}
		})
	}
}

// TestNeverFitsSaysSo: a request predicted larger than the burst is refused
// for good, with RetryAfter 0 and a limit text that says it never fits.
func TestNeverFitsSaysSo(t *testing.T) {
	b := New(Spec{Rate: 0.15, Burst: 0.5})
	_, d := Admit(t0, []Request{{Budget: b, Cost: 0.8}}, nil)
	want := Denial{Reason: vocab.ReasonPerQuery, Limit: "burst_limit=500ms (a predicted 800ms never fits)"}
	if d == nil || *d != want {
		t.Fatalf("denial %+v, want %+v", d, want)
	}
}
