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
		{"no calls: the mean stands", Reading{Reset: t0, Rows: []Row{{QueryID: 1, Calls: 1200, ExecMS: 530, PlanMS: 10}}},
			[]Learned{{QueryID: 1, Seconds: 0.0002}}, 0, 0},
		{"counters going back are a reset", Reading{Reset: t0, Rows: []Row{{QueryID: 1, Calls: 5, ExecMS: 1}}}, nil, 1, 0},
		{"and the next read learns from the new baseline", Reading{Reset: t0, Rows: []Row{{QueryID: 1, Calls: 15, ExecMS: 2}}},
			[]Learned{{QueryID: 1, Calls: 10, Seconds: 0.0001}}, 1, 0},
		{"a whole reset discards every baseline", Reading{Reset: t0.Add(time.Hour), Rows: []Row{{QueryID: 1, Calls: 20, ExecMS: 3}}}, nil, 2, 0},
		{"a vanished entry is counted", Reading{Reset: t0.Add(time.Hour)}, nil, 3, 0},
		{"nonsense is rejected", Reading{Reset: t0.Add(time.Hour), Rows: []Row{
			{QueryID: 2, Calls: -1, ExecMS: 1}, {QueryID: 3, Calls: 1, ExecMS: math.NaN()}, {QueryID: 4, Calls: 1, ExecMS: math.Inf(1)},
			{QueryID: 5, Calls: 1, ExecMS: 1, PlanMS: -1}, {QueryID: 6, Calls: 1, ExecMS: 1}, {QueryID: 6, Calls: 2, ExecMS: 1}}}, nil, 3, 6},
		{"an absurd mean is rejected", Reading{Reset: t0.Add(time.Hour), Rows: []Row{{QueryID: 7, Calls: 1, ExecMS: 0}}}, nil, 3, 6},
		{"", Reading{Reset: t0.Add(time.Hour), Rows: []Row{{QueryID: 7, Calls: 2, ExecMS: 1e12}}}, nil, 3, 7},
	}
	var tr tracker
	for _, s := range steps {
		ids := []int64{1, 2, 3, 4, 5, 6, 7}
		tr.keep(ids)
		got := tr.update(t0, s.reading, nil)
		if !slices.EqualFunc(got, s.want, func(a, b Learned) bool {
			return a.QueryID == b.QueryID && a.Calls == b.Calls && math.Abs(a.Seconds-b.Seconds) < 1e-12
		}) || tr.resets != s.resets || tr.rejected != s.rejected {
			t.Fatalf("%s: learned %+v, resets %d, rejected %d; want %+v, %d, %d", s.name, got, tr.resets, tr.rejected, s.want, s.resets, s.rejected)
		}
	}
}

func TestTrackerForgetsWhatIsNoLongerAsked(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	var tr tracker
	tr.keep([]int64{1})
	tr.update(t0, Reading{Rows: []Row{{QueryID: 1, Calls: 1, ExecMS: 1}}}, nil)
	tr.keep(nil) // the pattern left the model
	tr.update(t0, Reading{}, nil)
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
	tr := tracker{maxAge: reportIntervals * time.Second} // a read a second
	tr.keep([]int64{1})
	now := t0
	read := func(calls int64, ms float64) []Learned {
		now = now.Add(time.Second)
		return tr.update(now, Reading{Reset: t0, Rows: []Row{{QueryID: 1, Calls: calls, ExecMS: ms}}}, nil)
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
	if got := read(1110, 520); len(got) != 1 || got[0].Calls != 0 || math.Abs(got[0].Seconds-want) > 1e-12 {
		t.Fatalf("no executions: %+v, want the mean standing, no calls", got)
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

// TestTrackerDuplicatedEntry: an entry (identifier and role) twice or three times in one
// reading makes no sense: every copy is rejected and counted, none teaches, and no baseline is
// kept from it.
func TestTrackerDuplicatedEntry(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	var tr tracker
	tr.keep([]int64{1})
	tr.update(t0, Reading{Reset: t0, Rows: []Row{{QueryID: 1, Calls: 100, ExecMS: 100}}}, nil)
	got := tr.update(t0, Reading{Reset: t0, Rows: []Row{
		{QueryID: 1, Calls: 200, ExecMS: 100000}, // which of the two is the server's is unknown
		{QueryID: 1, Calls: 200, ExecMS: 200},
	}}, nil)
	if len(got) != 0 || tr.rejected != 2 {
		t.Fatalf("learned %+v, rejected %d from an entry twice in a reading; want nothing, 2", got, tr.rejected)
	}
	tr.update(t0, Reading{Reset: t0, Rows: []Row{{QueryID: 1, Calls: 1, ExecMS: 1}, {QueryID: 1, Calls: 2, ExecMS: 2},
		{QueryID: 1, Calls: 3, ExecMS: 3}}}, nil)
	if len(tr.base) != 0 || tr.rejected != 5 {
		t.Fatalf("baselines %v, rejected %d after an entry three times in a reading; want none, 5", tr.base, tr.rejected)
	}
}

// TestTrackerRolesStartOverApart: the server keeps an identifier's counters per role, and one
// role's entry can be reset or evicted while another's grows. Summed over roles, the others'
// growth would hide it (and teach the mean of the wrong executions); apart, that entry teaches
// nothing and is counted, and the others still teach their own executions' mean.
func TestTrackerRolesStartOverApart(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	var tr tracker
	read := func(rows ...Row) []Learned {
		tr.keep([]int64{1})
		return tr.update(t0, Reading{Reset: t0, Rows: rows}, nil)
	}
	read(Row{QueryID: 1, UserID: 10, Calls: 2, ExecMS: 300}, Row{QueryID: 1, UserID: 20, Calls: 1000, ExecMS: 2000})
	// Role 10's entry (a job's: 2 calls of 150 ms) is reset and runs once more; role 20 runs 400
	// more at 2 ms. Summed: 1403 − 1002 calls and 2950 − 2300 ms, a mean of 1.6 ms.
	got := read(Row{QueryID: 1, UserID: 10, Calls: 1, ExecMS: 150}, Row{QueryID: 1, UserID: 20, Calls: 1400, ExecMS: 2800})
	if len(got) != 1 || got[0].Calls != 400 || math.Abs(got[0].Seconds-0.002) > 1e-12 || tr.resets != 1 {
		t.Fatalf("one role's entry reset: learned %+v, resets %d; want 400 calls at 2ms, 1 reset", got, tr.resets)
	}
	// Role 10's entry is evicted: gone from the view while role 20's grows.
	got = read(Row{QueryID: 1, UserID: 20, Calls: 1500, ExecMS: 3000})
	if len(got) != 1 || got[0].Calls != 100 || tr.resets != 2 {
		t.Fatalf("one role's entry gone: learned %+v, resets %d; want role 20's 100 calls, 2 resets", got, tr.resets)
	}
	// Both grow: their growths add up.
	read(Row{QueryID: 1, UserID: 10, Calls: 1, ExecMS: 100}, Row{QueryID: 1, UserID: 20, Calls: 1500, ExecMS: 3000})
	got = read(Row{QueryID: 1, UserID: 10, Calls: 3, ExecMS: 400}, Row{QueryID: 1, UserID: 20, Calls: 1598, ExecMS: 3196})
	if len(got) != 1 || got[0].Calls != 100 {
		t.Fatalf("both roles grew: learned %+v, want their 100 calls together", got)
	}
}

// TestTrackerEvictionDiscardsBaselines: the server evicted entries (pg_stat_statements_info's
// dealloc moved) since the last read: an evicted entry made anew may have outgrown its old
// counters, which neither a reset stamp nor counters going back would show. That read teaches
// nothing and counts a reset; the next one learns from the new baselines.
func TestTrackerEvictionDiscardsBaselines(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	var tr tracker
	tr.keep([]int64{1})
	tr.update(t0, Reading{Reset: t0, Dealloc: 3, Rows: []Row{{QueryID: 1, Calls: 20, ExecMS: 2}}}, nil)
	// Evicted and made anew: 30 calls of 5 ms, more than the old baseline's 20.
	got := tr.update(t0, Reading{Reset: t0, Dealloc: 4, Rows: []Row{{QueryID: 1, Calls: 30, ExecMS: 150}}}, nil)
	if len(got) != 0 || tr.resets != 1 {
		t.Fatalf("after an eviction: learned %+v, resets %d; want nothing, 1 reset", got, tr.resets)
	}
	got = tr.update(t0, Reading{Reset: t0, Dealloc: 4, Rows: []Row{{QueryID: 1, Calls: 40, ExecMS: 200}}}, nil)
	if len(got) != 1 || math.Abs(got[0].Seconds-0.005) > 1e-12 {
		t.Fatalf("the read after: learned %+v, want 5 ms", got)
	}
}

// TestTrackerHostileCounters: what the server (or something posing as it) may report.
func TestTrackerHostileCounters(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	read := func(tr *tracker, r Reading) []Learned { tr.keep([]int64{1}); return tr.update(t0, r, nil) }
	row := func(calls int64, exec, plan float64) []Row {
		return []Row{{QueryID: 1, Calls: calls, ExecMS: exec, PlanMS: plan}}
	}
	t.Run("a whole reset whose counters outgrew the baseline teaches nothing", func(t *testing.T) {
		var tr tracker
		read(&tr, Reading{Reset: t0, Rows: row(10, 10, 0)})
		if got := read(&tr, Reading{Reset: t0.Add(time.Second), Rows: row(1000, 5000, 0)}); len(got) != 0 || tr.resets != 1 {
			t.Fatalf("learned %+v, resets %d", got, tr.resets)
		}
		if got := read(&tr, Reading{Reset: t0.Add(time.Second), Rows: row(1100, 5100, 0)}); len(got) != 1 || math.Abs(got[0].Seconds-0.001) > 1e-12 {
			t.Fatalf("after: %+v", got)
		}
	})
	t.Run("a stamp going back (another server) is a reset", func(t *testing.T) {
		var tr tracker
		read(&tr, Reading{Reset: t0, Rows: row(10, 10, 0)})
		if got := read(&tr, Reading{Reset: t0.Add(-time.Hour), Rows: row(20, 20, 0)}); len(got) != 0 || tr.resets != 1 {
			t.Fatalf("learned %+v, resets %d", got, tr.resets)
		}
	})
	t.Run("calls up, time down is a reset", func(t *testing.T) {
		var tr tracker
		read(&tr, Reading{Reset: t0, Rows: row(10, 10, 5)})
		if got := read(&tr, Reading{Reset: t0, Rows: row(20, 12, 0)}); len(got) != 0 || tr.resets != 1 {
			t.Fatalf("learned %+v, resets %d", got, tr.resets)
		}
	})
	t.Run("infinities and an overflowing sum are rejected", func(t *testing.T) {
		var tr tracker
		read(&tr, Reading{Reset: t0, Rows: row(10, 10, 0)})
		if got := read(&tr, Reading{Reset: t0, Rows: row(20, math.Inf(-1), math.Inf(1))}); len(got) != 0 || tr.rejected != 1 {
			t.Fatalf("learned %+v, rejected %d", got, tr.rejected)
		}
		if got := read(&tr, Reading{Reset: t0, Rows: row(30, 1e308, 1e308)}); len(got) != 0 || tr.rejected != 2 {
			t.Fatalf("overflowing sum: learned %+v, rejected %d", got, tr.rejected)
		}
	})
	t.Run("huge counters", func(t *testing.T) {
		var tr tracker
		read(&tr, Reading{Reset: t0, Rows: row(math.MaxInt64-10, 1e15, 0)})
		got := read(&tr, Reading{Reset: t0, Rows: row(math.MaxInt64, 1e15+10, 0)})
		for _, l := range got {
			if !(l.Seconds >= 0) || math.IsInf(l.Seconds, 0) || l.Seconds > maxMean.Seconds() || l.Calls != 10 {
				t.Fatalf("learned %+v", l)
			}
		}
	})
}

// TestTrackerAges: with maxAge set, a baseline older than it teaches nothing (its growth spans
// the gap) and an average older than it is not mixed into the next growth; within it, both
// count.
func TestTrackerAges(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	tr := tracker{maxAge: 10 * time.Second}
	read := func(at time.Duration, calls int64, ms float64) []Learned {
		tr.keep([]int64{1})
		return tr.update(t0.Add(at), Reading{Reset: t0, Rows: []Row{{QueryID: 1, Calls: calls, ExecMS: ms}}}, nil)
	}
	read(0, 100, 100)
	if got := read(10*time.Second, 200, 200); len(got) != 1 || got[0].Seconds != 0.001 {
		t.Fatalf("a baseline 10s old (maxAge): learned %+v, want 1 ms", got)
	}
	if got := read(25*time.Second, 300, 1200); len(got) != 0 {
		t.Fatalf("a baseline 15s old: learned %+v, want nothing", got)
	}
	if got := read(26*time.Second, 400, 2200); len(got) != 1 || got[0].Seconds != 0.01 {
		t.Fatalf("after the gap: learned %+v, want 10 ms alone, not blended with the 1 ms of 16s ago", got)
	}
	if got := read(27*time.Second, 500, 2300); len(got) != 1 || math.Abs(got[0].Seconds-(1.0+0.5*(0.1-1.0))/100) > 1e-12 {
		t.Fatalf("a second's growth later: learned %+v, want the smoothed mean", got)
	}
}

// TestTrackerIdleMeanStands: an identifier that stops running keeps its mean, reported with no
// calls at every read while the server still holds its entry (an idle pattern stays on the
// server's clock however long it idles), and nothing once the entry is gone.
func TestTrackerIdleMeanStands(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	tr := tracker{maxAge: 10 * time.Second}
	read := func(at time.Duration, rows ...Row) []Learned {
		tr.keep([]int64{1})
		return tr.update(t0.Add(at), Reading{Reset: t0, Rows: rows}, nil)
	}
	read(0, Row{QueryID: 1, Calls: 100, ExecMS: 50})
	if got := read(time.Second, Row{QueryID: 1, Calls: 200, ExecMS: 53}); len(got) != 1 || got[0].Calls != 100 {
		t.Fatalf("growth: %+v", got)
	}
	for i := 2; i < 60; i++ { // a minute idle, six times maxAge
		got := read(time.Duration(i)*time.Second, Row{QueryID: 1, Calls: 200, ExecMS: 53})
		if len(got) != 1 || got[0].Calls != 0 || math.Abs(got[0].Seconds-0.00003) > 1e-12 {
			t.Fatalf("idle %ds: %+v, want the mean 30µs standing", i, got)
		}
	}
	if got := read(time.Minute); len(got) != 0 {
		t.Fatalf("entry gone: %+v, want nothing", got)
	}
}
