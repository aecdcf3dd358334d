package coord

import (
	"strconv"
	"time"
)

// Shared quarantines (see the package documentation for the round trip). Decisions:
//
//   - Redis holds the fingerprint and the end only: no query text (the status shows it once
//     this instance has met the pattern, from its own cache; text read back from Redis would
//     be untrusted text on the status page), no instance id, no strikes (each instance counts
//     its own overruns; only the quarantines they lead to are shared).
//   - Pruning is the script's: HPEXPIRE, which expires fields by themselves, needs Redis 7.4.
//     Every call drops ended fields, and the hash expires with its last quarantine, so Redis
//     holds no more than the quarantines in force, at most MaxQuarantines per budget.
//   - The settings are part of the key. A reload that changes a budget's after: or for: lifts
//     its quarantines on the instance (the engine forgets them, and the handle what waits to
//     be published) and the instance then reads and writes a fresh hash, so quarantines made
//     under the old settings do not come back; while a change rolls out, the instances on the
//     old and on the new settings share quarantines among themselves only. The old hash lapses
//     with its last quarantine.
//   - Times cross Redis as durations left, never as instants: an instance sends how long its
//     quarantine has left, the script turns that into its own clock, and replies how long each
//     has left, which the receiver adds to its own. The instances' clocks need not agree; the
//     round trip can lengthen a quarantine by its duration (a sync's deadline at most).

// MaxQuarantines bounds the quarantines of one shared budget: in Redis, in one reply, and
// waiting on an instance to be published. Past it, new ones stay local until old ones end.
const MaxQuarantines = 1000

// QuarantineSpec is a shared budget's quarantine settings (rules.Quarantine): a pattern that
// overran After times within For is refused for For.
type QuarantineSpec struct {
	After int
	For   time.Duration
}

// Quarantined is a pattern quarantined in a shared budget until Until.
type Quarantined struct {
	Fingerprint uint64 // pg_query's fingerprint (pattern.Pattern.FingerprintID)
	Until       time.Time
}

// Quarantines receives the quarantines of the shared budgets in force across the instances:
// the engine's table of quarantines. The coordinator calls it from its own goroutine, never
// under its lock; implementations must be safe for concurrent use.
type Quarantines interface {
	// AddQuarantines hands over, at now, the quarantines in force of the budget spec.Name
	// under the settings spec.Quarantine (which may no longer be the budget's: a reload may
	// have changed them since the sync was sent). Those of this instance are among them.
	AddQuarantines(now time.Time, spec Spec, qs []Quarantined)
}

// QuarantineKey is the Redis key of a budget's quarantines under settings q:
// pgtraffic:{budget@<digest>}:q:<after>:<for> (see [HashTag]), for as a Go duration ("30s").
func QuarantineKey(database, budget string, q QuarantineSpec) string {
	return KeyPrefix + HashTag(database, budget) + ":q:" + strconv.Itoa(q.After) + ":" + q.For.String()
}

// Quarantine publishes, at the budget's next sync, that this instance quarantined the pattern
// fp until until, and asks for that sync early. It never blocks; a budget without shared
// quarantines, or with MaxQuarantines waiting, ignores it.
func (h *Handle) Quarantine(fp uint64, until time.Time) {
	h.c.mu.Lock()
	ok := h.e.core.quarantined(Quarantined{fp, until})
	h.c.mu.Unlock()
	if ok {
		h.Kick()
	}
}

// quarantined records q to publish; false when the budget shares no quarantines or the
// queue is full. A fingerprint already waiting keeps the later end.
func (c *core) quarantined(q Quarantined) bool {
	if c.spec.Quarantine == (QuarantineSpec{}) {
		return false
	}
	for i := range c.publish {
		if p := &c.publish[i]; p.Fingerprint == q.Fingerprint {
			if q.Until.After(p.Until) {
				p.Until = q.Until
			}
			return true
		}
	}
	if len(c.publish) >= MaxQuarantines {
		return false
	}
	c.publish = append(c.publish, q)
	return true
}

// takePublish returns the quarantines to publish in a sync sent at now, those that have not
// ended, and forgets them; a failed sync gives them back (unpublished).
func (c *core) takePublish(now time.Time) []Quarantined {
	out := c.publish[:0:0]
	for _, q := range c.publish {
		if q.Until.After(now) {
			out = append(out, q)
		}
	}
	c.publish = nil
	return out
}

// unpublished gives back the quarantines of a failed sync, to be sent at the next one.
func (c *core) unpublished(qs []Quarantined) {
	for _, q := range qs {
		c.quarantined(q)
	}
}

// decodeQuarantines reads the script's list of quarantines in force, {fingerprint, µs left,
// ...}, under settings q. Redis is not trusted to hold only what the script wrote: an entry
// whose fingerprint is not 16 hex digits, or whose time left is not a positive number, is
// ignored, a time left beyond q.For is cut to it, and past MaxQuarantines the rest are
// ignored; ignored counts what was ignored.
func decodeQuarantines(v any, q QuarantineSpec) (out []leftFor, ignored int) {
	list, ok := v.([]any)
	if !ok {
		return nil, 1
	}
	for j := 0; j+1 < len(list); j += 2 {
		if len(out) == MaxQuarantines {
			ignored += (len(list) - j) / 2
			break
		}
		fp, okFP := parseFingerprint(list[j])
		left, err := parseNum(list[j+1])
		if !okFP || err != nil || !(left >= 1) {
			ignored++
			continue
		}
		d := q.For
		if left < float64(q.For.Microseconds()) {
			d = time.Duration(left) * time.Microsecond
		}
		out = append(out, leftFor{fp, d})
	}
	if len(list)%2 != 0 {
		ignored++
	}
	return out, ignored
}

// parseFingerprint reads a fingerprint as the script stores it.
func parseFingerprint(x any) (uint64, bool) {
	s, ok := x.(string)
	if !ok || len(s) != 16 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return 0, false
		}
	}
	fp, err := strconv.ParseUint(s, 16, 64)
	return fp, err == nil
}
