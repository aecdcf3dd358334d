package serverclock

import (
	"math"
	"slices"
	"testing"
	"time"
)

func TestTracker(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	type step struct {
		name     string
		reading  Reading
		want     []Learned
		resets   uint64
		rejected uint64
	}
	steps := []step{
		{"first sight takes a baseline only", Reading{Reset: t0, Rows: []Row{{QueryID: 1, Calls: 1000, ExecMS: 500}}}, nil, 0, 0},
		{"growth teaches the mean", Reading{Reset: t0, Rows: []Row{{QueryID: 1, Calls: 1100, ExecMS: 520}}},
			[]Learned{{QueryID: 1, Calls: 100, Seconds: 0.0002}}, 0, 0},
		{"planning counts where tracked", Reading{Reset: t0, Rows: []Row{{QueryID: 1, Calls: 1200, ExecMS: 530, PlanMS: 10}}},
			[]Learned{{QueryID: 1, Calls: 100, Seconds: 0.0002}}, 0, 0},
		{"no calls teach nothing", Reading{Reset: t0, Rows: []Row{{QueryID: 1, Calls: 1200, ExecMS: 530, PlanMS: 10}}}, nil, 0, 0},
		{"counters going back are a reset", Reading{Reset: t0, Rows: []Row{{QueryID: 1, Calls: 5, ExecMS: 1}}}, nil, 1, 0},
		{"and the next read learns from the new baseline", Reading{Reset: t0, Rows: []Row{{QueryID: 1, Calls: 15, ExecMS: 2}}},
			[]Learned{{QueryID: 1, Calls: 10, Seconds: 0.0001}}, 1, 0},
		{"a whole reset discards every baseline", Reading{Reset: t0.Add(time.Hour), Rows: []Row{{QueryID: 1, Calls: 20, ExecMS: 3}}}, nil, 2, 0},
		{"a vanished entry is counted", Reading{Reset: t0.Add(time.Hour)}, nil, 3, 0},
		{"nonsense is rejected", Reading{Reset: t0.Add(time.Hour), Rows: []Row{
			{QueryID: 2, Calls: -1, ExecMS: 1}, {QueryID: 3, Calls: 1, ExecMS: math.NaN()}, {QueryID: 4, Calls: 1, ExecMS: math.Inf(1)},
			{QueryID: 5, Calls: 1, ExecMS: 1, PlanMS: -1}, {QueryID: 6, Calls: 1, ExecMS: 1}, {QueryID: 6, Calls: 2, ExecMS: 1}}}, nil, 3, 5},
		{"an absurd mean is rejected", Reading{Reset: t0.Add(time.Hour), Rows: []Row{{QueryID: 7, Calls: 1, ExecMS: 0}}}, nil, 3, 5},
		{"", Reading{Reset: t0.Add(time.Hour), Rows: []Row{{QueryID: 7, Calls: 2, ExecMS: 1e12}}}, nil, 3, 6},
	}
	var tr tracker
	for _, s := range steps {
		ids := []int64{1, 2, 3, 4, 5, 6, 7}
		tr.keep(ids)
		got := tr.update(s.reading, nil)
		if !slices.EqualFunc(got, s.want, func(a, b Learned) bool {
			return a.QueryID == b.QueryID && a.Calls == b.Calls && math.Abs(a.Seconds-b.Seconds) < 1e-12
		}) || tr.resets != s.resets || tr.rejected != s.rejected {
			t.Fatalf("%s: learned %+v, resets %d, rejected %d; want %+v, %d, %d", s.name, got, tr.resets, tr.rejected, s.want, s.resets, s.rejected)
		}
	}
}

func TestTrackerForgetsWhatIsNoLongerAsked(t *testing.T) {
	var tr tracker
	tr.keep([]int64{1})
	tr.update(Reading{Rows: []Row{{QueryID: 1, Calls: 1, ExecMS: 1}}}, nil)
	tr.keep(nil) // the pattern left the model
	tr.update(Reading{}, nil)
	if tr.resets != 0 || len(tr.base) != 0 {
		t.Fatalf("resets %d, baselines %v: an identifier no longer asked about is dropped uncounted", tr.resets, tr.base)
	}
}

// TestTrackerWeighsReadsByCalls: the mean a read reports averages the recent reads by their
// executions, as the server's own mean does (total seconds over total executions). Under a
// server_share budget a read in which the server was slow covers fewer executions: 100 at
// 0.1ms, then 10 at 1ms (each 10ms of the server's time) average 0.18ms, where an average of
// the two reads' means would say 0.55ms, three times the server's.
func TestTrackerWeighsReadsByCalls(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	var tr tracker
	tr.keep([]int64{1})
	read := func(calls int64, ms float64) []Learned {
		return tr.update(Reading{Reset: t0, Rows: []Row{{QueryID: 1, Calls: calls, ExecMS: ms}}}, nil)
	}
	read(1000, 500) // the baseline
	if got := read(1100, 510); len(got) != 1 || math.Abs(got[0].Seconds-0.0001) > 1e-12 {
		t.Fatalf("first growth: %+v, want 0.1ms", got)
	}
	got := read(1110, 520)
	want := 0.020 / 110 // the server's mean over both reads
	if len(got) != 1 || got[0].Calls != 10 || math.Abs(got[0].Seconds-want) > 1e-12 {
		t.Fatalf("a slow read of few executions: %+v, want %d calls at the mean by executions %.6f s", got, 10, want)
	}
	if got := read(1110, 520); len(got) != 0 {
		t.Fatalf("no executions: %+v, want nothing learned", got)
	}
	if got := read(1210, 530); len(got) != 1 || got[0].Seconds >= want {
		t.Fatalf("after a read with nothing run, a fast read: %+v, want below %.6f s (the average stood, then moved)", got, want)
	}
	for range reportIntervals + 1 {
		read(1210, 530) // idle past the prediction's life
	}
	if got := read(1220, 550); len(got) != 1 || math.Abs(got[0].Seconds-0.002) > 1e-12 {
		t.Fatalf("after %d idle reads: %+v, want the new read's own mean 2ms (the old average is the past's)", reportIntervals+1, got)
	}
}
