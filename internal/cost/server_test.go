package cost

import (
	"math"
	"testing"
	"time"
)

func TestModelServerClock(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	m := NewModel(10)
	const fp = 1
	for range 5 {
		m.Observe(fp, "", 10, 0.003, false) // the client's clock: 3ms at plan cost 10
	}
	if p := m.Predict(now, fp, 20); p.Server || math.Abs(p.Seconds-0.006) > 1e-9 {
		t.Fatalf("before any report: %+v, want the client's 6ms", p)
	}
	if m.ObserveServer(now, fp, 9, 0.0001, now.Add(time.Second)) {
		t.Fatal("took a report before the pattern had a query identifier")
	}
	m.PutQueryID(fp, "", 9)
	for _, bad := range []float64{-1, math.NaN(), math.Inf(1)} {
		if m.ObserveServer(now, fp, 9, bad, now.Add(time.Second)) {
			t.Fatalf("took a report of %v seconds", bad)
		}
	}
	if !m.ObserveServer(now, fp, 9, 0.0001, now.Add(time.Second)) {
		t.Fatal("report not taken")
	}
	// On the server's clock, k is the server's mean over the mean plan cost: 0.1ms / 10.
	if p := m.Predict(now, fp, 20); !p.Server || !p.OK || math.Abs(p.Seconds-0.0002) > 1e-12 {
		t.Fatalf("after a report: %+v, want the server's 0.2ms", p)
	}
	m.PutPlan(now, fp, 10)
	if p := m.Predict(now, fp, 0); !p.Server || !p.Cached || math.Abs(p.Seconds-0.0001) > 1e-12 {
		t.Fatalf("cached plan after a report: %+v, want the server's 0.1ms", p)
	}
	// A second report replaces the mean: the reader averaged it over its recent reads.
	m.ObserveServer(now, fp, 9, 0.0003, now.Add(time.Second))
	if s := m.Top(now, 1)[0]; !s.Server || math.Abs(s.ServerMean-0.0003) > 1e-12 {
		t.Fatalf("Top = %+v, want server mean 0.3ms", s)
	}
	later := now.Add(time.Second)
	if p := m.Predict(later, fp, 20); p.Server || math.Abs(p.Seconds-0.006) > 1e-9 {
		t.Fatalf("after the report lapsed: %+v, want the client's clock", p)
	}
	if s := m.Top(later, 1)[0]; s.Server {
		t.Fatalf("Top after the report lapsed: %+v", s)
	}
}
