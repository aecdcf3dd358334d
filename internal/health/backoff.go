package health

import (
	"math"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// MaxBackoffIntervals is the longest [Backoff] ceiling, in sampling intervals.
const MaxBackoffIntervals = 4

// Backoff returns how long a waiter sleeps before checking health again
// after its attempt-th refusal (attempt 0 is the first). The ceiling starts
// at one interval and doubles per attempt up to [MaxBackoffIntervals]
// intervals; the result is drawn uniformly from [ceiling/2, ceiling) by rnd,
// which the caller draws from [0, 1).
//
// The half-ceiling floor keeps waiters from re-checking a sample that cannot
// have changed yet (samples arrive once per interval); the jitter spreads
// them over several samples, so that when a metric drops only the first few
// resume and the next sample sees their effect before the rest follow.
// A non-positive interval means [vocab.DefaultHealthInterval]; rnd outside [0, 1) is
// clamped.
func Backoff(attempt int, interval time.Duration, rnd float64) time.Duration {
	if interval <= 0 {
		interval = vocab.DefaultHealthInterval
	}
	ceiling := interval
	for i := 0; i < attempt && ceiling/interval < MaxBackoffIntervals && ceiling <= math.MaxInt64/2; i++ {
		ceiling *= 2
	}
	return jitter(ceiling, rnd)
}

// reconnectDelay is how long the sampler waits before its next connection
// attempt after failures consecutive failed ones: one interval, doubling up
// to reconnectCeiling, with the same half-floor jitter as [Backoff] so
// that many processes do not reconnect to a restarted server in lockstep.
func reconnectDelay(failures int, interval time.Duration, rnd float64) time.Duration {
	ceiling := reconnectCeiling(interval)
	d := interval
	for i := 1; i < failures && d < ceiling && d <= math.MaxInt64/2; i++ {
		d *= 2
	}
	return jitter(min(d, ceiling), rnd)
}

// maxReconnectIntervals is the longest reconnect back-off, in sampling
// intervals (see reconnectCeiling).
const maxReconnectIntervals = 4

// minReconnectCeiling keeps a very short interval from dialing an
// unreachable or overloaded server dozens of times a second.
const minReconnectCeiling = time.Second

// reconnectCeiling is the longest wait between the sampler's connection
// attempts: maxReconnectIntervals intervals, but at least a second. While
// the sampler is not connected every health metric turns stale (once its
// last good sample is [StaleIntervals] intervals old) and enforce budgets
// that throttle on health admit nothing, so the ceiling is also how
// long throttling can outlast an outage once the server is back: it must be
// a few intervals, not minutes.
func reconnectCeiling(interval time.Duration) time.Duration {
	if interval <= 0 {
		interval = vocab.DefaultHealthInterval
	}
	if interval > math.MaxInt64/maxReconnectIntervals {
		return interval
	}
	return max(maxReconnectIntervals*interval, minReconnectCeiling)
}

// jitter draws a duration uniformly from [ceiling/2, ceiling) by rnd in
// [0, 1), clamping rnd (NaN counts as 0), and at least 1ns.
func jitter(ceiling time.Duration, rnd float64) time.Duration {
	if !(rnd >= 0) {
		rnd = 0
	}
	floor := ceiling / 2
	d := floor + time.Duration(min(rnd, 1)*float64(ceiling-floor))
	if d >= ceiling && ceiling > floor {
		d = ceiling - 1 // rnd == 1, or float rounding of huge durations
	}
	return max(d, 1) // never 0: a waiter must not spin
}
