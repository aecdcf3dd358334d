package budget

import (
	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"maps"
	"testing"
	"time"
)

// TestDecisionCounts counts decisions over a few intervals, with a gap, and reads them back
// as totals, by reason and per interval.
func TestDecisionCounts(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 5})
	iv := HistoryInterval.Seconds()
	start := t0.Truncate(HistoryInterval)
	when := func(intervals, sec float64) time.Time {
		return start.Add(time.Duration((intervals*iv + sec) * float64(time.Second)))
	}
	for range 3 {
		b.Count(when(0, 1), Admitted, "")
	}
	b.Count(when(0, 2), Blocked, vocab.ReasonConcurrency)
	b.Count(when(0, 9), Warned, vocab.ReasonBudget)
	// Intervals 1 and 2 see nothing; interval 3 is read in the middle and counted after.
	charge(t, when(3, 0), b, "", 2)
	b.Snapshot(when(3, 1))
	b.Count(when(3, 2), Blocked, vocab.ReasonBudget)
	b.Count(when(3, 2), Blocked, vocab.ReasonConcurrency)
	b.Count(when(4, 0), Admitted, "")

	d := b.Snapshot(when(4, 5)).Decisions
	if d.Admitted != 4 || d.Warned != 1 || d.Blocked != 3 {
		t.Errorf("totals %d/%d/%d, want 4 admitted (Admit counts none), 1 warned, 3 blocked",
			d.Admitted, d.Warned, d.Blocked)
	}
	if want := map[string]uint64{vocab.ReasonConcurrency: 2, vocab.ReasonBudget: 1}; !maps.Equal(d.BlockedBy, want) {
		t.Errorf("blocked by reason %v, want %v", d.BlockedBy, want)
	}
	if want := map[string]uint64{vocab.ReasonBudget: 1}; !maps.Equal(d.WarnedBy, want) {
		t.Errorf("warned by reason %v, want %v", d.WarnedBy, want)
	}
	if len(d.History) != HistoryLen {
		t.Fatalf("%d samples, want %d", len(d.History), HistoryLen)
	}
	h := d.History[HistoryLen-5:]
	want := []Sample{
		{Start: when(0, 0), Admitted: 3, Warned: 1, Blocked: 1},
		{Start: when(1, 0)},
		{Start: when(2, 0)},
		{Start: when(3, 0), Blocked: 2, Debt: 2 - 1, DebtRead: true},
		{Start: when(4, 0), Admitted: 1, Debt: 0, DebtRead: true}, // drained by then
	}
	for i := range want {
		if !h[i].Start.Equal(want[i].Start) {
			t.Errorf("sample %d starts %v, want %v", i, h[i].Start, want[i].Start)
		}
		h[i].Start = want[i].Start
		if h[i] != want[i] {
			t.Errorf("sample %d = %+v, want %+v", i, h[i], want[i])
		}
	}
}
