package budget

import (
	"cmp"
	"math"
	"strconv"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// DefaultMaxKeys bounds the per-key state table when [Spec.MaxKeys] is 0.
const DefaultMaxKeys = 100_000

// DefaultBurst is the bucket size of a budget with drain rate rate and no burst_limit: rate
// × [vocab.DefaultBurstWindow], in execution seconds.
func DefaultBurst(rate float64) float64 { return rate * vocab.DefaultBurstWindow.Seconds() }

// Spec is the configuration of one budget. Zero values mean "unlimited" or
// "off" as noted on each field; [New] and [Budget.SetSpec] normalise invalid
// values (negative, NaN) to those zero values.
type Spec struct {
	// MaxConcurrent is how many queries of one key may be in flight at once;
	// 0 is unlimited.
	MaxConcurrent int
	// PerQueryLimit is the largest predicted cost of one query, in seconds;
	// 0 is unlimited.
	PerQueryLimit float64
	// Rate is the drain rate in execution seconds per second
	// (server_share × server_cores); 0 means no bucket.
	Rate float64
	// Burst is the bucket size in execution seconds (burst_limit). With a
	// Rate and no Burst it defaults to [DefaultBurst] of Rate.
	Burst float64
	// WarningThreshold in (0, 1] asks for a [Warning] when an admission
	// leaves any limit at least this full; 0 is off.
	WarningThreshold float64
	// MaxKeys bounds the number of per-key states; 0 is [DefaultMaxKeys].
	MaxKeys int
	// MaxQueue is how many statements may wait for one key's room at once (queue.go); 0:
	// none waits.
	MaxQueue int
	// Keyless counts every request under the empty key, whatever its Key: a budget with no per
	// tag. A spec that becomes Keyless (a reload dropped per) folds every key's slots and debt
	// into the empty key's, and the releases of requests admitted under the old keys go there
	// too, so that the budget's limits hold for what already runs. (The other way, a keyless
	// budget that becomes keyed, the empty key's slots drain as their requests are released,
	// and the new keys start empty.)
	Keyless bool
}

// normalize returns s with invalid values replaced by their documented
// defaults, so that the core never meets a NaN or a negative limit.
func (s Spec) normalize() Spec {
	s.MaxConcurrent = max(s.MaxConcurrent, 0)
	if !(s.PerQueryLimit > 0) || math.IsInf(s.PerQueryLimit, 1) {
		s.PerQueryLimit = 0
	}
	// An infinite rate drains instantly: the same as no bucket.
	if !(s.Rate > 0) || math.IsInf(s.Rate, 1) {
		s.Rate = 0
	}
	if s.Rate == 0 {
		s.Burst = 0
	} else if !(s.Burst > 0) {
		s.Burst = DefaultBurst(s.Rate)
	}
	if !(s.WarningThreshold > 0 && s.WarningThreshold <= 1) {
		s.WarningThreshold = 0
	}
	if s.MaxKeys <= 0 {
		s.MaxKeys = DefaultMaxKeys
	}
	s.MaxQueue = max(s.MaxQueue, 0)
	return s
}

// coldSlots stands in for MaxConcurrent, in a budget without one, when sizing
// the reservation of an unknown cost: PostgreSQL's default max_connections, as
// many statements as a default server runs at once, which together reserve one
// burst. Fewer slots would refuse the cold start of a process whose pool is
// larger under a budget that its known costs never fill.
const coldSlots = 100

// slotsOf is how many statements a key with maxConcurrent slots runs at once, as an unknown
// cost's reservation counts them: maxConcurrent, or coldSlots without one.
func slotsOf(maxConcurrent int) int { return cmp.Or(maxConcurrent, coldSlots) }

// unknownCost is what a statement of unknown cost (its pattern has not run
// yet) reserves in a budget with a bucket: a slot's share of the burst, with
// one share more kept back for statements of known cost, so that a cold start
// with every slot on a new pattern reserves most of one burst but never all of
// it; and no more than PerQueryLimit, the most a statement may cost (an
// admission cuts it to the room left, while some is: see Budget.reservation).
// It never exceeds a limit by itself: an unknown cost alone is never a reason
// to refuse a statement outright, only, like any cost, to wait for room. The
// guess is not reserved: it scales the planner's cost by a k learned from a few
// statements of other patterns, which at a cold start can be off by orders of
// magnitude either way (a primary-key lookup guessed at 13 s), so reserving it
// would refuse a cold start that fits, or let one through that does not.
func (s Spec) unknownCost() float64 {
	if s.Rate == 0 {
		return 0 // no bucket: nothing to reserve
	}
	c := s.Burst / float64(slotsOf(s.MaxConcurrent)+1)
	if s.PerQueryLimit > 0 {
		c = min(c, s.PerQueryLimit)
	}
	return c
}

// limitText holds the human names of a spec's limits, built once per spec so
// that denials and warnings do not format strings on the hot path.
type limitText struct {
	concurrency string // "max_concurrent=4"
	perQuery    string // "per_query_limit=2s"
	burst       string // "burst_limit=10s"
}

func newLimitText(s Spec) limitText {
	return limitText{
		concurrency: ConcurrencyLimit(s.MaxConcurrent),
		perQuery:    vocab.FieldPerQueryLimit + "=" + formatSeconds(s.PerQueryLimit),
		burst:       vocab.FieldBurstLimit + "=" + formatSeconds(s.Burst),
	}
}

// ConcurrencyLimit and ShareLimit name a budget's limit as a denial's Limit does, the way the
// rules file spells it: "max_concurrent=4", "server_share=0".
func ConcurrencyLimit(n int) string { return vocab.FieldMaxConcurrent + "=" + strconv.Itoa(n) }

// QueueLimit is the limit of a statement refused for a full queue of bound n ("max_queue=n").
func QueueLimit(n int) string { return vocab.FieldMaxQueue + "=" + strconv.Itoa(n) }

// ShareLimit: see ConcurrencyLimit.
func ShareLimit(share float64) string {
	return vocab.FieldServerShare + "=" + strconv.FormatFloat(share, 'g', -1, 64)
}

// neverFits is the limit text of a refusal by a bucket too small for cost.
// Formatted only on that refusal, which callers should not retry.
func (t limitText) neverFits(cost float64) string {
	return t.burst + " (a predicted " + formatSeconds(cost) + " never fits)"
}

// formatSeconds writes seconds the way the rules file spells durations.
func formatSeconds(sec float64) string {
	if math.IsInf(sec, 1) || sec*1e9 >= math.MaxInt64 {
		return strconv.FormatFloat(sec, 'g', -1, 64) + "s"
	}
	return time.Duration(sec * 1e9).String()
}
