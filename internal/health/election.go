package health

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// LeaseIntervals is how many sampling intervals an election's lease lasts without renewal: the
// sampler renews it every interval, so one late round does not hand it over, and a sampler
// that died is replaced within LeaseIntervals intervals plus one follower's poll.
const LeaseIntervals = 2

// Election shares one sampler among the instances that read the same database with the same
// metric set: the instance holding the lease samples and publishes, the others read what it
// published. The engine passes one built on Redis (package coord); without it every sampler
// samples for itself.
//
// Everything an Election returns is untrusted (it comes from Redis): the sampler validates
// every published reading and treats what it cannot trust as stale, never as healthy.
// Implementations bound each call by ctx, must be safe for concurrent use, and must be
// comparable (a pointer): the sampler tells a new election from the one it voted in.
type Election interface {
	// Elect renews the lease of b.Set or takes it when it is free. When another instance holds
	// it, the vote carries the sample that instance last published. An error means the
	// election could not be held (Redis unreachable): the sampler then samples for itself.
	Elect(ctx context.Context, b Ballot) (Vote, error)
	// Publish makes readings the set's sample, if this instance still holds its lease.
	Publish(ctx context.Context, b Ballot, readings []Shared) error
	// Resign gives up the lease of b.Set if this instance holds it, so that another instance
	// takes over at its next poll rather than when the lease lapses.
	Resign(ctx context.Context, b Ballot) error
}

// ErrNotReady is the error (errors.Is) of an Election that cannot be held yet (it has not read
// what it needs to sign and check samples): the sampler samples for itself meanwhile, as when
// the election fails, but does not warn about it.
var ErrNotReady = errors.New("the election is not ready yet")

// Ballot names what is elected: a metric set (with its queries and interval) of this
// sampler's database.
type Ballot struct {
	// Set identifies the metric set: a hex digest of the interval and of each metric with its
	// query, so that instances that read different things never share a sample.
	Set string
	// Interval is the sampling interval: the lease lasts [LeaseIntervals] of it and a sample
	// [StaleIntervals] of it.
	Interval time.Duration
}

// Vote is the outcome of an election round.
type Vote struct {
	// Lead is true when this instance holds the lease: it samples and publishes.
	Lead bool
	// Published holds the readings the lease holder last published, each Age measured up to
	// the vote; nil while it has published none.
	Published []Shared
	// Bad, when not empty, says why what was published cannot be read (malformed, too large,
	// dated in the future): every metric of the set then reads as stale.
	Bad string
}

// MaxSharedReadings bounds the readings of one published sample: an Election reads a sample
// holding more as malformed, and a publisher sends no more than this many.
const MaxSharedReadings = 256

// Shared is one metric's reading as published.
type Shared struct {
	Metric string
	Value  float64
	// Age is how long before its publication (in a vote: before the vote) the value was read.
	Age time.Duration
	// Err is why the holder's last read of the metric failed; "" for a good value.
	Err string
}

// maxPlausible bounds a published value of the metrics whose range the sampler knows: more
// backends than PostgreSQL can have, or a lag of centuries, is not a reading but a forgery.
var maxPlausible = map[string]float64{
	vocab.MetricActiveQueries:  1 << 20,
	vocab.MetricReplicationLag: 1e10,
}

// setKey is the Ballot.Set of the metric set defs read every interval.
func setKey(interval time.Duration, order []string, defs map[string]string) string {
	h := sha256.New()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(interval))
	h.Write(b[:])
	for _, m := range order {
		// Length-prefixed, so that no two sets write the same bytes.
		for _, s := range []string{m, defs[m]} {
			binary.BigEndian.PutUint64(b[:], uint64(len(s)))
			h.Write(b[:])
			h.Write([]byte(s))
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// adopt turns a vote's published sample into a round's results for cfg at now: a reading
// that is missing, failed, out of range, dated in the future or too old is a failed read,
// never a healthy value; as after a failed read of its own, the follower's last good value then
// stands until it is stale (see [Sampler.Evaluate]). A vote with nothing published yet gives
// no result: the readings age as they are.
func adopt(v Vote, cfg *config, now time.Time, interval time.Duration) []result {
	if v.Bad == "" && v.Published == nil {
		return nil
	}
	byMetric := make(map[string]Shared, len(v.Published))
	for _, r := range v.Published {
		if _, dup := byMetric[r.Metric]; dup {
			v.Bad = "a metric published twice"
			break
		}
		byMetric[r.Metric] = r
	}
	limit := StaleIntervals * interval
	out := make([]result, 0, len(cfg.order))
	for _, m := range cfg.order {
		res := result{metric: m, sql: cfg.defs[m], shared: true}
		r, ok := byMetric[m]
		switch {
		case v.Bad != "":
			res.err, res.report = "published sample rejected: "+v.Bad, true
		case !ok:
			res.err, res.report = "missing from the published sample", true
		case r.Err != "":
			res.err = "the elected sampler's read failed: " + r.Err
		case r.Age < 0:
			res.err, res.report = "published sample dated in the future", true
		case r.Age > limit:
			res.err = fmt.Sprintf("published sample is %s old (stale after %s)", r.Age.Round(time.Millisecond), limit)
		case !plausible(m, r.Value):
			res.err, res.report = fmt.Sprintf("published value %g is out of range", r.Value), true
		default:
			res.value, res.at = r.Value, now.Add(-r.Age)
		}
		out = append(out, res)
	}
	return out
}

// plausible reports whether v can be a reading of metric. NaN never is: it compares false
// with every threshold, so it would never throttle.
func plausible(metric string, v float64) bool {
	if math.IsNaN(v) {
		return false
	}
	if hi, ok := maxPlausible[metric]; ok {
		return v >= 0 && v <= hi && (metric != vocab.MetricActiveQueries || v == math.Trunc(v))
	}
	return true
}

// toShare is what a lead publishes after a round: each metric of cfg as it now stands in
// readings, its age taken at now. A metric never read yet is left out (followers then keep
// aging their own copy of it).
func toShare(readings map[string]reading, cfg *config, now time.Time) []Shared {
	out := make([]Shared, 0, len(cfg.order))
	for _, m := range cfg.order {
		r, ok := readings[m]
		switch {
		case !ok || r.sql != cfg.defs[m]:
		case r.err != "":
			out = append(out, Shared{Metric: m, Err: r.err})
		case r.good:
			out = append(out, Shared{Metric: m, Value: r.value, Age: max(now.Sub(r.at), 0)})
		}
	}
	return out
}
