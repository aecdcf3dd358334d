package budget

import (
	"sync"
	"sync/atomic"
	"time"
)

// Decision is what a budget decided about one statement, as the engine counts it with
// [Budget.Count]: one decision per statement and budget (and one more for a statement that ran
// past the budget's max_duration), the same the engine reports to its observer (the
// pgtraffic.decisions metric). They are a budget's only counts: [Admit] counts
// nothing, since a retry is not a new statement and a warn-mode budget's would-be refusal is a
// warning.
type Decision uint8

const (
	Admitted Decision = iota // the statement ran and the budget had nothing to say about it
	Warned                   // it ran with a warning (in warn mode: one that enforce would have refused)
	Blocked                  // it was refused
	decisions
)

// The history of a budget's decisions is HistoryLen intervals of HistoryInterval, the current
// one last: five minutes, enough to see an incident start and end on the status page.
const (
	HistoryInterval = 10 * time.Second
	HistoryLen      = 30
)

// Decisions are a budget's decision counts since it was created, and their recent history.
type Decisions struct {
	Admitted, Warned, Blocked uint64
	// WarnedBy and BlockedBy split Warned and Blocked by reason (never nil).
	WarnedBy, BlockedBy map[string]uint64
	// History is the last HistoryLen intervals, oldest first, the current one last.
	History []Sample
}

// Sample is one interval of a budget's history.
type Sample struct {
	Start                     time.Time // the interval's start
	Admitted, Warned, Blocked uint64    // decisions counted in the interval
	// Debt is the largest debt (execution seconds, summed over keys) that a [Budget.Snapshot]
	// read in the interval; DebtRead is false when none read it.
	Debt     float64
	DebtRead bool
}

// tally counts decisions. The totals are atomic, since every statement adds one. The history
// is a ring of marks: the totals as the first event (a count or a snapshot) of an interval
// found them. An interval with no mark had no count, so the decisions of a marked interval are
// the difference between its mark and the next one (or the totals, for the latest): nothing
// runs periodically, a count that finds its interval marked costs one atomic load more, and
// a statement counted as the interval turns may fall in either. The zero value is ready.
type tally struct {
	totals [decisions]atomic.Uint64
	latest atomic.Int64 // 1 + the latest marked interval; 0 before any mark

	mu       sync.Mutex // protects the fields below
	byReason [decisions]map[string]uint64
	ring     [HistoryLen]mark
}

type mark struct {
	interval int64 // 1 + the slot's interval since the Unix epoch; 0 when never marked
	totals   [decisions]uint64
	debt     float64
	debtRead bool
}

func interval(now time.Time) int64 { return now.UnixNano() / int64(HistoryInterval) }

// Count counts one statement's decision d at now, with its reason ("" for Admitted).
func (b *Budget) Count(now time.Time, d Decision, reason string) {
	t := &b.tally
	if iv := interval(now); t.latest.Load() != iv+1 {
		t.mark(iv, 0, false)
	}
	t.totals[d].Add(1)
	if d != Admitted {
		t.addReason(d, reason)
	}
}

func (t *tally) addReason(d Decision, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byReason[d] == nil {
		t.byReason[d] = map[string]uint64{}
	}
	t.byReason[d][reason]++
}

// mark marks interval iv if it is new, and notes a debt read in it.
func (t *tally) mark(iv int64, debt float64, read bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if iv+1 < t.latest.Load() {
		return // a late count or read of an interval already past: it stays where it fell
	}
	m := &t.ring[slot(iv)]
	if m.interval != iv+1 {
		*m = mark{interval: iv + 1}
		for d := range m.totals {
			m.totals[d] = t.totals[d].Load()
		}
		t.latest.Store(iv + 1)
	}
	if read {
		m.debt, m.debtRead = max(m.debt, debt), true
	}
}

func slot(iv int64) int { return int((iv%HistoryLen + HistoryLen) % HistoryLen) }

// decisions reports the counts at now, noting debt as read then.
func (t *tally) decisions(now time.Time, debt float64) Decisions {
	iv := interval(now)
	t.mark(iv, debt, true)
	t.mu.Lock()
	defer t.mu.Unlock()
	var totals [decisions]uint64
	for d := range totals {
		totals[d] = t.totals[d].Load()
	}
	out := Decisions{Admitted: totals[Admitted], Warned: totals[Warned], Blocked: totals[Blocked],
		WarnedBy: copyCounts(t.byReason[Warned]), BlockedBy: copyCounts(t.byReason[Blocked]),
		History: make([]Sample, HistoryLen)}
	// Walk back from the current interval: each mark's decisions run up to the next mark.
	next := totals
	for i := HistoryLen - 1; i >= 0; i-- {
		j := iv - int64(HistoryLen-1-i)
		s := &out.History[i]
		s.Start = time.Unix(0, j*int64(HistoryInterval))
		m := &t.ring[slot(j)]
		if m.interval != j+1 {
			continue
		}
		s.Admitted, s.Warned, s.Blocked = next[Admitted]-m.totals[Admitted], next[Warned]-m.totals[Warned],
			next[Blocked]-m.totals[Blocked]
		s.Debt, s.DebtRead = m.debt, m.debtRead
		next = m.totals
	}
	return out
}

func copyCounts(m map[string]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
