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
	Calls   int64   // executions between the two reads
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
type tracker struct {
	base  map[int64]baseline
	reset time.Time
	read  uint64 // numbers the readings
	// counts of events, for the reader's counters
	resets, rejected uint64
}

type baseline struct {
	calls int64
	ms    float64
	read  uint64 // the reading that last saw it
	// sec and n average the server seconds and the executions of the reads since the baseline
	// was taken (smooth); 0 before its first growth. grew is the reading of the last growth:
	// an average older than reportIntervals readings is the past's (its prediction lapsed
	// meanwhile), and the next growth starts a new one.
	sec, n float64
	grew   uint64
}

// keep drops the baselines of identifiers not in ids (no longer asked about), uncounted.
func (t *tracker) keep(ids []int64) {
	if len(t.base) == 0 {
		return
	}
	asked := make(map[int64]struct{}, len(ids))
	for _, id := range ids {
		asked[id] = struct{}{}
	}
	for id := range t.base {
		if _, ok := asked[id]; !ok {
			delete(t.base, id)
		}
	}
}

// update takes reading r of the identifiers last passed to keep and appends to dst what it teaches: the mean of each identifier whose
// calls grew since its baseline.
func (t *tracker) update(r Reading, dst []Learned) []Learned {
	if t.base == nil {
		t.base = map[int64]baseline{}
	}
	t.read++
	if !r.Reset.Equal(t.reset) {
		if len(t.base) > 0 {
			t.resets++
		}
		clear(t.base)
		t.reset = r.Reset
	}
	for _, row := range r.Rows {
		ms := row.ExecMS + row.PlanMS
		b, had := t.base[row.QueryID]
		if row.Calls < 0 || !(ms >= 0) || math.IsInf(ms, 0) || row.ExecMS < 0 || row.PlanMS < 0 || (had && b.read == t.read) {
			t.rejected++ // negative, NaN, infinite, or the same identifier twice in one reading
			delete(t.base, row.QueryID)
			continue
		}
		nb := baseline{calls: row.Calls, ms: ms, read: t.read}
		switch {
		case !had: // first seen: its counters hold history of unknown age
		case row.Calls < b.calls || ms < b.ms:
			t.resets++ // reset or evicted and re-created since the baseline
		case row.Calls == b.calls:
			nb.sec, nb.n, nb.grew = b.sec, b.n, b.grew // nothing ran: the average stands
		default:
			n := row.Calls - b.calls
			sec := (ms - b.ms) / 1e3
			if sec/float64(n) > maxMean.Seconds() {
				t.rejected++
				delete(t.base, row.QueryID)
				continue
			}
			nb.sec, nb.n, nb.grew = sec, float64(n), t.read
			if b.n > 0 && t.read-b.grew <= reportIntervals {
				nb.sec, nb.n = b.sec+smooth*(sec-b.sec), b.n+smooth*(float64(n)-b.n)
			}
			dst = append(dst, Learned{QueryID: row.QueryID, Calls: n, Seconds: nb.sec / nb.n})
		}
		t.base[row.QueryID] = nb
	}
	for id, b := range t.base {
		if b.read != t.read {
			// Gone from the view (evicted, or reset with the rest before a Reset stamp moved):
			// its next appearance starts a new baseline.
			t.resets++
			delete(t.base, id)
		}
	}
	return dst
}
