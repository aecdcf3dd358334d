package serverclock

import (
	"math"
	"time"
)

// maxMean is the largest mean execution time a report may claim: a larger one is nonsense.
const maxMean = 24 * time.Hour

// Learned is what a read teaches of one query identifier: its executions since the last read,
// and its mean server seconds per execution over the recent reads (smooth), weighted by their
// executions.
type Learned struct {
	QueryID int64
	Calls   int64   // executions between the two reads; 0: it did not run, its mean stands
	Seconds float64 // mean server seconds per execution, planning included where tracked
}

// smooth is how much of the recent reads' seconds and executions each new read replaces. The
// mean a read reports is the ratio of the two averages, not an average of each read's mean:
// under a server_share budget a read in which the server was slow covers fewer executions (the
// budget allows the same seconds), and an average of the reads' means would weigh each of its
// executions as much as several of the others', learning a mean above the server's own
// (total seconds over total executions) whenever the statement's time varies.
const smooth = 0.5

// tracker turns successive readings of cumulative counters into per-read means. It is a plain
// single-threaded core; the zero value is ready.
//
// The server keeps one entry per query identifier and role: each entry has its baseline, and
// an identifier's growth in a read is the sum of its entries' growths. An entry that went back
// or vanished (reset or evicted) teaches nothing and starts its identifier's average over, but
// the others still teach: summed over roles, the others' growth would hide one role's entry
// starting over.
type tracker struct {
	base map[entry]baseline
	avg  map[int64]average
	// reset and dealloc are the view's whole-reset stamp and eviction count as last read: when
	// either moves, any entry may have started over, and every baseline is discarded.
	reset   time.Time
	dealloc int64
	read    uint64 // numbers the readings
	// maxAge is how old a baseline or an average may be and still count (0: any age): the
	// reader's reportIntervals, after which a pattern's prediction lapses. A read after a
	// longer gap (failed rounds, or rounds that adopted another instance's reading) neither
	// learns the whole gap's mean nor mixes in an average from before it.
	maxAge time.Duration
	// counts of events, for the reader's counters
	resets, rejected uint64
	// update's scratch: how often each entry is in the reading, where each identifier's
	// growth is in the read's list (-1: reported idle), and the identifiers of entries that
	// did not run since the last read
	dups  map[entry]int
	grown map[int64]int
	idle  []int64
}

// entry is one pg_stat_statements entry of the reader's database: a query identifier as run by
// one role.
type entry struct {
	id   int64
	user uint32
}

type baseline struct {
	calls int64
	ms    float64
	read  uint64    // the reading that last saw it
	at    time.Time // when
}

// average is an identifier's server seconds and executions averaged over its recent reads
// (smooth). grew is when it last grew: an average older than maxAge is the past's, which the
// next growth does not mix with but starts anew; until then it stands for the idle identifier.
type average struct {
	sec, n float64
	grew   time.Time
}

// keep drops the baselines and averages of identifiers not in ids (no longer asked about),
// uncounted.
func (t *tracker) keep(ids []int64) {
	if len(t.base) == 0 && len(t.avg) == 0 {
		return
	}
	asked := make(map[int64]struct{}, len(ids))
	for _, id := range ids {
		asked[id] = struct{}{}
	}
	for e := range t.base {
		if _, ok := asked[e.id]; !ok {
			delete(t.base, e)
		}
	}
	for id := range t.avg {
		if _, ok := asked[id]; !ok {
			delete(t.avg, id)
		}
	}
}

// stale reports whether something dated then is too old to count at now (maxAge).
func (t *tracker) stale(then, now time.Time) bool { return t.maxAge > 0 && now.Sub(then) > t.maxAge }

// update takes reading r, made at now, of the identifiers last passed to keep and appends to
// dst what it teaches: the mean of each identifier whose calls grew since its entries'
// baselines, then, with Calls 0, the mean of each that is still in the view with an average
// but did not run since the last read. The server still holds what it spends on those: an
// idle pattern stays on the server's clock, and only one the server no longer reports (its
// entry evicted or reset, the extension gone, reads failing) returns to the client's.
func (t *tracker) update(now time.Time, r Reading, dst []Learned) []Learned {
	t.begin(r)
	var grown []growth
	for _, row := range r.Rows {
		grown = t.take(now, row, grown)
	}
	for e, b := range t.base {
		if b.read != t.read {
			// Gone from the view (evicted, or reset with the rest before a Reset stamp moved):
			// its next appearance starts a new baseline.
			t.resets++
			delete(t.base, e)
			delete(t.avg, e.id)
		}
	}
	for _, g := range grown {
		a := average{sec: g.sec, n: float64(g.n), grew: now}
		if old, ok := t.avg[g.id]; ok && old.n > 0 && !t.stale(old.grew, now) {
			a.sec, a.n = old.sec+smooth*(g.sec-old.sec), old.n+smooth*(float64(g.n)-old.n)
		}
		t.avg[g.id] = a
		dst = append(dst, Learned{QueryID: g.id, Calls: g.n, Seconds: a.sec / a.n})
	}
	for _, id := range t.idle {
		if _, grew := t.grown[id]; grew {
			continue // another role's entry of it ran
		}
		if a, ok := t.avg[id]; ok && a.n > 0 {
			t.grown[id] = -1 // reported: once, whatever its entries
			dst = append(dst, Learned{QueryID: id, Seconds: a.sec / a.n})
		}
	}
	return dst
}

// begin readies t for reading r: a new reading's number, every baseline and average
// discarded when the view was reset as a whole or entries were evicted since the last, and
// how often each entry is in r.
func (t *tracker) begin(r Reading) {
	if t.base == nil {
		t.base, t.avg, t.dups, t.grown = map[entry]baseline{}, map[int64]average{}, map[entry]int{}, map[int64]int{}
	}
	t.read++
	if !r.Reset.Equal(t.reset) || r.Dealloc != t.dealloc {
		if len(t.base) > 0 {
			t.resets++
		}
		clear(t.base)
		clear(t.avg) // perhaps another server's (a failover)
		t.reset, t.dealloc = r.Reset, r.Dealloc
	}
	clear(t.dups)
	clear(t.grown)
	t.idle = t.idle[:0]
	for _, row := range r.Rows {
		t.dups[entry{row.QueryID, row.UserID}]++
	}
}

// growth is an identifier's growth in one read, summed over its entries.
type growth struct {
	id  int64
	n   int64
	sec float64
}

// take takes row of the reading begun, made at now: its entry's new baseline, and its growth
// since the last, if it teaches, added to its identifier's in grown (in the order the
// identifiers first grew).
func (t *tracker) take(now time.Time, row Row, grown []growth) []growth {
	e := entry{row.QueryID, row.UserID}
	ms := row.ExecMS + row.PlanMS
	if row.Calls < 0 || !(ms >= 0) || math.IsInf(ms, 0) || row.ExecMS < 0 || row.PlanMS < 0 || t.dups[e] > 1 {
		t.rejected++ // negative, NaN, infinite, or the same entry twice in one reading
		delete(t.base, e)
		return grown
	}
	b, had := t.base[e]
	t.base[e] = baseline{calls: row.Calls, ms: ms, read: t.read, at: now}
	switch {
	case !had: // first seen: its counters hold history of unknown age
	case t.stale(b.at, now):
		// Last read before a long gap: its growth is the whole gap's, long past.
	case row.Calls == b.calls && ms == b.ms:
		t.idle = append(t.idle, row.QueryID) // it did not run since the last read
	case row.Calls < b.calls || ms < b.ms:
		t.resets++ // reset or evicted and re-created since the baseline: its average starts over
		delete(t.avg, row.QueryID)
	case row.Calls > b.calls:
		n, sec := row.Calls-b.calls, (ms-b.ms)/1e3
		if sec/float64(n) > maxMean.Seconds() {
			t.rejected++
			delete(t.base, e)
			return grown
		}
		i, ok := t.grown[row.QueryID]
		if !ok {
			i = len(grown)
			t.grown[row.QueryID] = i
			grown = append(grown, growth{id: row.QueryID})
		}
		grown[i].n += n
		grown[i].sec += sec
	}
	return grown
}
