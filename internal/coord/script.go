package coord

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/budget"
)

//go:embed sync.lua
var syncSource string

// syncScript runs by EVALSHA and falls back to EVAL when Redis lost its script cache (a
// restart), so a sync never needs a separate load step.
var syncScript = redis.NewScript(syncSource)

// KeyPrefix starts every key this package writes.
const KeyPrefix = "pgtraffic:"

// HashTag is the Redis Cluster hash tag of the keys of a budget of a database, "{budget}" or,
// for a database named (Options.Database), "{budget@<digest of database>}", with '{', '}',
// '@' and '%' in the name percent-encoded so that any budget name makes exactly one tag: every
// key of a budget is in one slot, as a script touching several keys needs, and two databases'
// budgets of one name never share a key.
func HashTag(database, budget string) string {
	tag := tagEscaper.Replace(budget)
	if database != "" {
		sum := sha256.Sum256([]byte("pgtraffic budget\x00" + database))
		tag += "@" + hex.EncodeToString(sum[:8])
	}
	return "{" + tag + "}"
}

var tagEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D", "@", "%40")

// PartitionsKey is the Redis key of a budget's partitions, pgtraffic:{budget}:p3: one hash
// with a field per partition (see partitionField). The "3" is the layout: earlier layouts are
// never read.
func PartitionsKey(database, budget string) string {
	return KeyPrefix + HashTag(database, budget) + ":p3"
}

// WantChannel is the Redis channel of a budget, pgtraffic:{budget}:want, on which the sync
// script says that an instance wants more slots than it was granted while others hold slots
// beyond their targets (the message: the partition's field); each coordinator listens, and a
// holder then syncs early, its estimate of its demand falling fast, to hand those slots over.
func WantChannel(database, budget string) string {
	return KeyPrefix + HashTag(database, budget) + wantSuffix
}

// wantSuffix ends every budget's [WantChannel] (sync.lua names the channel the same way).
const wantSuffix = ":want"

// sweepKey holds the cursor of the sweep of a budget's lapsed partitions (sync.lua).
func sweepKey(database, budget string) string { return PartitionsKey(database, budget) + ":sweep" }

// partitionField is a partition's field in its budget's [PartitionsKey]: its key, which a long
// value of the budget's per tag is hashed into (budget.KeyOf), so that a huge tag value cannot
// make huge fields.
func partitionField(partition string) string { return budget.KeyOf(partition) }

// errStale is a call that Redis ran after its deadline (it sat in the socket of a Redis
// that hung): it changed nothing.
var errStale = errors.New("coord: Redis ran the sync after its deadline")

// reply is the script's answer: Redis's clock, and one result per partition unless stale;
// for a call with the quarantine key, the budget's quarantines in force.
type reply struct {
	now         int64 // µs of Redis TIME
	stale       bool
	results     []result
	quarantines []leftFor
	ignored     int // quarantines read that were ignored as invalid (decodeQuarantines)
}

// leftFor is a quarantine in force, as the script reports it: time left from its call.
type leftFor struct {
	fp   uint64
	left time.Duration
}

// call is one script call of a budget's sync: its reports, and whether it carries the
// budget's quarantine key (the first call of a sync of a budget with shared quarantines), with
// the quarantines to publish, whose time left counts from at.
type call struct {
	database    string // Options.Database: with spec.Name, it names the budget's keys
	spec        Spec
	notAfter    int64 // µs of Redis TIME after which Redis must not act on the call; 0: none
	reps        []report
	quarantines bool
	publish     []Quarantined
	at          time.Time
}

// runSync sends one call and decodes the answers.
func runSync(ctx context.Context, rc redis.Scripter, instance string, interval time.Duration, cl call) (reply, error) {
	spec, reps := cl.spec, cl.reps
	keys := make([]string, 2, 3)
	keys[0], keys[1] = PartitionsKey(cl.database, spec.Name), sweepKey(cl.database, spec.Name)
	args := make([]any, 0, 10+len(reps)+2*len(cl.publish))
	lease := leaseDuration(interval)
	var qfor int64
	if cl.quarantines {
		// In Redis's microseconds, at least one: the script shares no quarantine of for 0.
		qfor = max(spec.Quarantine.For.Microseconds(), 1)
	}
	args = append(args, instance, lease.Milliseconds(), ffmt(spec.Rate), ffmt(spec.Burst), spec.MaxConcurrent,
		max(interval.Milliseconds(), 1), cl.notAfter, qfor, MaxQuarantines)
	packed := make([]byte, 0, reportBytes*len(reps))
	for _, r := range reps {
		packed = r.appendPacked(packed)
	}
	args = append(args, packed)
	for _, r := range reps {
		args = append(args, partitionField(r.p.key))
	}
	if cl.quarantines {
		keys = append(keys, QuarantineKey(cl.database, spec.Name, spec.Quarantine))
		for _, q := range cl.publish {
			if left := q.Until.Sub(cl.at).Microseconds(); left > 0 {
				args = append(args, vocab.FingerprintHex(q.Fingerprint), left)
			}
		}
	}
	v, err := syncScript.Run(ctx, rc, keys, args...).Slice()
	if err != nil {
		return reply{}, err
	}
	var q *QuarantineSpec
	if cl.quarantines {
		q = &spec.Quarantine
	}
	r, err := decodeReply(v, len(reps), q)
	for i := range r.results {
		r.results[i].clamp(spec, lease)
	}
	return r, err
}

// reportFields is how many values one partition's report holds, and reportBytes its size as
// the script reads them: as many little-endian float64 (sync.lua, ARGV[10]).
const (
	reportFields = 11
	reportBytes  = reportFields * 8
)

// appendPacked appends r as the script reads it. Every count and µs figure fits a float64
// exactly (below 2^53).
func (r report) appendPacked(b []byte) []byte {
	flag := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	for _, x := range [reportFields]float64{float64(r.seq), r.used, r.demand, float64(r.want),
		float64(r.applied), float64(r.inflight), flag(r.leave), float64(r.expected),
		float64(r.age.Microseconds()), r.held, flag(r.recovering)} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
	}
	return b
}

// maxLive bounds the instance count a reply may report, as the script bounds lost ones.
const maxLive = 100_000

// maxDebtSeconds bounds the global debt a reply may report, in seconds of the budget's
// rate: the script keeps no more.
const maxDebtSeconds = 3600

// clamp makes every number of r one that the script could have sent for spec: none
// negative or non-finite, no lease beyond the budget's own limits, no retake beyond a
// lease duration. Redis is not trusted to hold only what the script wrote.
func (r *result) clamp(spec Spec, lease time.Duration) {
	r.lease.Rate = within(r.lease.Rate, spec.Rate)
	r.lease.Burst = within(r.lease.Burst, spec.Burst)
	r.lease.Slots = min(r.lease.Slots, spec.MaxConcurrent)
	r.live = min(r.live, maxLive)
	r.debt = within(r.debt, spec.Rate*maxDebtSeconds)
	r.target = within(r.target, spec.Rate)
	r.targetSlots = min(r.targetSlots, spec.MaxConcurrent)
	r.retake = min(r.retake, lease)
	r.inForce = Limits{Rate: within(r.inForce.Rate, spec.Rate), Burst: within(r.inForce.Burst, spec.Burst),
		MaxConcurrent: min(r.inForce.MaxConcurrent, spec.MaxConcurrent)}
	r.hold = within(r.hold, spec.Burst)
}

// within is x in [0, hi], and 0 for NaN.
func within(x, hi float64) float64 {
	if !(x > 0) {
		return 0
	}
	return min(x, hi)
}

// count is x as a count, in [0, MaxInt32]: a huge or non-finite float has no int value.
func count(x float64) int { return int(within(x, math.MaxInt32)) }

// decodeReply reads the script's answer for n partitions, and with q (the call carried the
// quarantine key under those settings) the quarantines in force after them.
func decodeReply(v []any, n int, q *QuarantineSpec) (reply, error) {
	if len(v) < 2 {
		return reply{}, fmt.Errorf("coord: sync script returned %d values", len(v))
	}
	now, err := parseNum(v[0])
	if err != nil {
		return reply{}, fmt.Errorf("coord: sync script time: %w", err)
	}
	r := reply{now: int64(now), stale: v[1] == int64(1)}
	if r.stale {
		return r, errStale
	}
	want := 3
	if q != nil {
		want = 4
	}
	if len(v) != want {
		return reply{}, fmt.Errorf("coord: sync script returned %d values, want %d", len(v), want)
	}
	if q != nil {
		r.quarantines, r.ignored = decodeQuarantines(v[3], *q)
	}
	blob, ok := v[2].(string)
	if !ok {
		return reply{}, fmt.Errorf("coord: sync script results: unexpected %T", v[2])
	}
	r.results, err = decodeResults(blob, n)
	return r, err
}

// ffmt writes a float exactly, as Lua's tonumber reads it.
func ffmt(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// resultFields is how many numbers the script returns per partition, each a little-endian
// float64 (sync.lua's result_format).
const resultFields = 13

// decodeResults reads n partitions' results from the script's string of them. Any bit
// pattern is some float64: the clamp that follows bounds what Redis could have forged.
func decodeResults(blob string, n int) ([]result, error) {
	if len(blob) != n*resultFields*8 {
		return nil, fmt.Errorf("coord: sync script returned %d bytes of results for %d partitions", len(blob), n)
	}
	out := make([]result, n)
	for i := range out {
		f := blob[i*resultFields*8:]
		num := func(j int) float64 {
			var b [8]byte
			copy(b[:], f[j*8:j*8+8])
			return math.Float64frombits(binary.LittleEndian.Uint64(b[:]))
		}
		r := &out[i]
		r.lease = budget.Lease{Rate: num(0), Burst: num(1), Slots: count(num(2))}
		r.live = count(num(3))
		r.debt = num(4)
		r.target = num(5)
		r.targetSlots = count(num(6))
		r.retake = time.Duration(count(num(7))) * time.Microsecond
		r.inForce = Limits{Rate: num(8), Burst: num(9), MaxConcurrent: count(num(10))}
		r.differ = num(11) == 1
		r.hold = num(12)
	}
	return out, nil
}

// parseNum reads a number of the script's reply. Its error never quotes the reply's text,
// which strconv's would, at any length.
func parseNum(x any) (float64, error) {
	switch v := x.(type) {
	case int64:
		return float64(v), nil
	case string:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("not a number (%d bytes)", len(v))
		}
		return f, nil
	}
	return 0, fmt.Errorf("unexpected %T", x)
}
