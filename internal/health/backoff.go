package health

import (
	"math"
	"time"
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
// A non-positive interval means [DefaultInterval]; rnd outside [0, 1) is
// clamped.
func Backoff(attempt int, interval time.Duration, rnd float64) time.Duration {
	if interval <= 0 {
		interval = DefaultInterval
	}
	ceiling := interval
	for i := 0; i < attempt && ceiling/interval < MaxBackoffIntervals && ceiling <= math.MaxInt64/2; i++ {
		ceiling *= 2
	}
	return jitter(ceiling, rnd)
}

// reconnectDelay is how long the sampler waits before its next connection
// attempt after failures consecutive failed ones: one interval, doubling up
// to maxReconnectDelay (or one interval if that is longer), with the same
// half-floor jitter as [Backoff] so that many processes do not reconnect to
// a restarted server in lockstep.
func reconnectDelay(failures int, interval time.Duration, rnd float64) time.Duration {
	ceiling := max(interval, maxReconnectDelay)
	d := interval
	for i := 1; i < failures && d < ceiling && d <= math.MaxInt64/2; i++ {
		d *= 2
	}
	return jitter(min(d, ceiling), rnd)
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
