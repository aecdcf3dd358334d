package coord

import (
	"context"
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// emptyRestart returns a down function for simConfig: Redis unreachable over [from, from+outage),
// and every key of the budget gone when it is back (a kill -9 and an empty restart), as in the
// shared-budget experiment's restart scenario.
var flushedKeys = map[string]int{}

func emptyRestart(rc *redis.Client, name string, from, outage time.Duration) func(time.Duration) bool {
	flushed := false
	return func(at time.Duration) bool {
		if at >= from && at < from+outage {
			return true
		}
		if at >= from+outage && !flushed {
			flushed = true
			ctx := context.Background()
			keys, err := rc.Keys(ctx, KeyPrefix+HashTag("", name)+"*").Result()
			if err != nil {
				panic(err)
			}
			if len(keys) > 0 {
				rc.Del(ctx, keys...)
			}
			flushedKeys[name] = len(keys)
		}
		return false
	}
}

// TestEmptyRestartAfterWindow measures, in virtual time, the aggregate admitted rate of eight
// instances of equal demand in windows after an empty restart of Redis at 15 s (Redis
// unreachable for the outage, then every key of the budget gone), against the same seeds
// with no restart (outage -1ns). The windows are relative to the restart: [8s,15s) is what
// the shared-budget experiment measured as the "after" window of its restart scenario until
// it timed a restart's chaos by the restart itself (it now starts 3 s after it). An empty restart must
// cost nothing there: each seed's after window may differ from the same seed's without a
// restart by at most the resolution of the window, and the mean over seeds by less than 2.5%.
// PGTRAFFIC_RESTART_SEEDS sets the number of seeds (default 4).
func TestEmptyRestartAfterWindow(t *testing.T) {
	rc := simRedis(t)
	seeds := 4
	if s := os.Getenv("PGTRAFFIC_RESTART_SEEDS"); s != "" {
		fmt.Sscan(s, &seeds)
	}
	const at = 15 * time.Second
	type win struct{ from, to time.Duration }
	wins := []win{{0, 3 * time.Second}, {3 * time.Second, 8 * time.Second}, {3 * time.Second, 10 * time.Second}, {8 * time.Second, 15 * time.Second}}
	control := map[uint64]float64{}
	for _, outage := range []time.Duration{-1, 0, 50 * time.Millisecond, 300 * time.Millisecond, time.Second} {
		sums := make([]float64, len(wins))
		diff := 0.0
		for seed := uint64(1); seed <= uint64(seeds); seed++ {
			name := fmt.Sprintf("restart-%v-%d", outage, seed)
			cfg := equalDemand(name, seed)
			if outage >= 0 {
				cfg.down = emptyRestart(rc, name, at, outage)
			}
			r := simulate(t, rc, cfg)
			line := fmt.Sprintf("outage %v seed %d:", outage, seed)
			for i, w := range wins {
				x := r.rate(at+w.from, at+w.to) / cfg.spec.Rate
				sums[i] += x
				line += fmt.Sprintf(" [%v,%v) %.3f", w.from, w.to, x)
			}
			after := r.rate(at+8*time.Second, at+15*time.Second) / cfg.spec.Rate
			if outage < 0 {
				control[seed] = after
			} else {
				diff += after - control[seed]
				if math.Abs(after-control[seed]) > 0.05 {
					t.Errorf("outage %v seed %d: after the restart %.3f of the rate, %.3f without it", outage, seed, after, control[seed])
				}
			}
			b0, b1 := bucketsOf(at, at+10*time.Second)
			line += fmt.Sprintf("; debt max %.3f", func() float64 {
				m := 0.0
				for _, d := range r.debt[b0:b1] {
					m = math.Max(m, d)
				}
				return m
			}())
			line += fmt.Sprintf("; keys flushed %d", flushedKeys[name])
			t.Log(line)
		}
		if outage >= 0 && math.Abs(diff/float64(seeds)) > 0.025 {
			t.Errorf("outage %v: after the restart the mean over %d seeds moved by %.3f of the rate", outage, seeds, diff/float64(seeds))
		}
		line := fmt.Sprintf("outage %v MEAN (restart - none in [8s,15s): %+.4f):", outage, diff/float64(seeds))
		for i, w := range wins {
			line += fmt.Sprintf(" [%v,%v) %.3f", w.from, w.to, sums[i]/float64(seeds))
		}
		t.Log(line)
	}
}

// TestEmptyRestartTrace prints, per 500 ms around an empty restart at 15 s, the aggregate
// admitted and the largest global debt and lease seen, with and without the restart.
func TestEmptyRestartTrace(t *testing.T) {
	if os.Getenv("PGTRAFFIC_RESTART_TRACE") == "" {
		t.Skip("diagnosis: set PGTRAFFIC_RESTART_TRACE=1")
	}
	rc := simRedis(t)
	const at = 15 * time.Second
	var outage time.Duration
	fmt.Sscan(os.Getenv("PGTRAFFIC_RESTART_TRACE"), &outage)
	seed := uint64(1)
	fmt.Sscan(os.Getenv("PGTRAFFIC_RESTART_SEED"), &seed)
	a := equalDemand(fmt.Sprintf("trace-none-%d", seed), seed)
	ra := simulate(t, rc, a)
	name := fmt.Sprintf("trace-restart-%v-%d", outage, seed)
	b := equalDemand(name, seed)
	b.down = emptyRestart(rc, name, at, outage)
	rb := simulate(t, rc, b)
	for from := at - 2*time.Second; from < at+15*time.Second; from += 500 * time.Millisecond {
		b0, b1 := bucketsOf(from, from+500*time.Millisecond)
		t.Logf("%5.1fs  none: %.3f debt %.3f lease %.4f | restart: %.3f debt %.3f lease %.4f", (from - at).Seconds(),
			ra.rate(from, from+500*time.Millisecond), maxOf(ra.debt[b0:b1]), maxOf(ra.lease[b0:b1]),
			rb.rate(from, from+500*time.Millisecond), maxOf(rb.debt[b0:b1]), maxOf(rb.lease[b0:b1]))
	}
}

func maxOf(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		m = math.Max(m, x)
	}
	return m
}
