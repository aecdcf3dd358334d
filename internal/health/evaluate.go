package health

import (
	"fmt"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// Evaluate is the throttle check of one budget: thresholds maps metric names
// to the level at which the budget stops admitting, inFlight is the
// connector's own queries in flight (for [vocab.MetricInFlight]), and enforce says
// whether the budget is in enforce mode. It reads the last published sample
// at now and never waits for I/O.
//
// A metric is exceeded when its value is at or above its threshold (>=): the
// threshold is the level at which throttling begins, so `active_queries: 8`
// admits while fewer than 8 queries are active, and `in_flight: 4` (counting
// the queries already in flight, not the one asking) keeps at most 4 in
// flight.
//
// A metric is stale when its last good sample is older than [StaleIntervals]
// intervals, when it has had no good sample for [StaleIntervals] intervals
// since it was configured, or when a read failed before it had any good
// sample; each metric's staleness is logged once when it begins. The
// intervals are those of the sampler that took the sample (see
// [Options.Replaces]). A read that
// fails after a good one leaves that value in force until it is
// [StaleIntervals] intervals old: one lost connection or slow round is no
// outage (the sampler reconnects at its next round), and the contract's
// staleness is an age. Staleness counts as exceeded only when enforce is
// true (fail safe); a warn budget is not warned about what is not known.
//
// Results: when a fresh metric is exceeded, the first such metric by name
// and its value, with exceeded true and stale false. Otherwise, when a
// metric is stale, the first stale metric by name and its last good value
// (0 if none), with exceeded equal to enforce and stale true. Otherwise
// ("", 0, false, false).
func (s *Sampler) Evaluate(now time.Time, thresholds map[string]float64, inFlight float64, enforce bool) (metric string, value float64, exceeded bool, stale bool) {
	snap := s.snap.Load()
	readings := snap.readings
	var over, old string
	var overValue, oldValue float64
	for m, threshold := range thresholds {
		v := inFlight
		if m != vocab.MetricInFlight {
			r, ok := readings[m]
			if at, dropped := snap.dropped[m]; !ok && dropped && now.Sub(at) <= StaleIntervals*s.interval {
				// Dropped from the metric set by a reload less than StaleIntervals ago: this
				// statement was decided by the rules it replaced, which the rules in force do
				// not hold it to.
				continue
			}
			limit := StaleIntervals * r.interval
			if ok && !r.good && r.err == "" && now.Sub(r.since) <= limit {
				// Not read yet, and configured less than StaleIntervals ago: like a sample
				// not yet old, it neither throttles nor counts as stale (a connector that
				// has just started does not refuse its first statements).
				continue
			}
			if !ok || !r.good || now.Sub(r.at) > limit {
				s.noteStale(m, r, ok, now, limit)
				if old == "" || m < old {
					old, oldValue = m, r.value
				}
				continue
			}
			v = r.value
		}
		if v >= threshold && (over == "" || m < over) {
			over, overValue = m, v
		}
	}
	switch {
	case over != "":
		return over, overValue, true, false
	case old != "":
		return old, oldValue, enforce, true
	}
	return "", 0, false, false
}

// noteStale logs the start of a metric's staleness, once: the reading's flag
// is shared by its copies in later snapshots and cleared by the next good
// read. A threshold on a metric the sampler was not configured to read is
// logged once per metric set.
func (s *Sampler) noteStale(metric string, r reading, configured bool, now time.Time, limit time.Duration) {
	if !configured {
		if _, logged := s.unconfigured.LoadOrStore(metric, struct{}{}); !logged {
			s.log.Warn("health: threshold on a metric the sampler does not read; it counts as stale",
				"metric", metric)
		}
		return
	}
	if r.staleLogged.Load() || !r.staleLogged.CompareAndSwap(false, true) {
		return
	}
	var reason string
	switch {
	case r.good:
		reason = fmt.Sprintf("last good sample is %s old (stale after %s)", now.Sub(r.at).Round(time.Millisecond), limit)
		if r.err != "" {
			reason += "; last read failed: " + r.err
		}
	case r.err != "":
		reason = "last read failed: " + r.err
	default:
		reason = "no sample yet"
	}
	s.log.Warn("health: metric is stale; enforce budgets throttle on it until a fresh sample",
		"metric", metric, "reason", reason)
}
