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
		m.Observe(fp, "", 10, 0.003, false, 1) // the client's clock: 3ms at plan cost 10
	}
	if p := m.Predict(now, fp, 20); p.Server || math.Abs(p.Seconds-0.006) > 1e-9 {
		t.Fatalf("before any report: %+v, want the client's 6ms", p)
	}
	if m.ObserveServer(now, fp, 9, 0.0001, now.Add(time.Second), 0) == nil {
		t.Fatal("took a report before the pattern had a query identifier")
	}
	m.PutQueryID(fp, "", 9)
	for _, bad := range []float64{-1, math.NaN(), math.Inf(1)} {
		if m.ObserveServer(now, fp, 9, bad, now.Add(time.Second), 0) == nil {
			t.Fatalf("took a report of %v seconds", bad)
		}
	}
	if err := m.ObserveServer(now, fp, 9, 0.0001, now.Add(time.Second), 0); err != nil {
		t.Fatalf("report not taken: %v", err)
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
	m.ObserveServer(now, fp, 9, 0.0003, now.Add(time.Second), 0)
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

// TestModelServerMeanImplausible: the server spends part of the time its client waits for a
// statement. A report of a mean the client's own measurements rule out (a pg_stat_statements
// returning nonsense: a million times the real mean) is not taken (ErrImplausible), and the
// predictions stay on the client's clock; a mean within what the client waited is taken.
func TestModelServerMeanImplausible(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	m := NewModel(10)
	const fp = 1
	for range 5 {
		m.Observe(fp, "", 10, 0.0003, false, 1) // 300 µs on the client's clock, the round trip taken off
	}
	m.PutQueryID(fp, "", 9)
	if err := m.ObserveServer(now, fp, 9, 10, now.Add(time.Second), 0.0002); err != ErrImplausible {
		t.Fatalf("a server mean of 10s for executions the client waited 500µs for: %v, want ErrImplausible", err)
	}
	if p := m.Predict(now, fp, 0); p.Server {
		t.Fatalf("after an implausible report: %+v, want the client's clock", p)
	}
	if err := m.ObserveServer(now, fp, 9, 0.0004, now.Add(time.Second), 0.0002); err != nil {
		t.Fatalf("a server mean of 400µs for executions the client waited 500µs for: %v", err)
	}
}

// TestModelProbeKeepsTheServersReport: a pattern refused as too costly on the client's clock
// (its history holds what the application spends around it, rows held open) and then reported
// by the server keeps the server's report through the next execution, the probe's or the
// first admitted one's, which starts the client's history anew: the server's report is its own
// account. Before, each report admitted one statement, whose execution wiped the report.
func TestModelProbeKeepsTheServersReport(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	m := NewModel(10)
	const fp = 1
	m.PutQueryID(fp, "", 9)
	for range 5 {
		m.Observe(fp, "", 0, 0.1, false, 1) // 100ms on the client's clock
	}
	m.NeverFits(now, fp) // refused by a per_query_limit of 20ms
	if err := m.ObserveServer(now, fp, 9, 0.00003, now.Add(10*time.Second), 0); err != nil {
		t.Fatal(err)
	}
	m.Observe(fp, "", 0, 0.1, false, 1) // the first execution since the refusal
	if p := m.Predict(now.Add(time.Second), fp, 0); !p.Server || math.Abs(p.Seconds-0.00003) > 1e-12 {
		t.Fatalf("after the execution: %+v, want the server's 30µs", p)
	}
}
