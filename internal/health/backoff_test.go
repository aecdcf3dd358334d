package health

import (
	"math"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	const i = time.Second
	tests := []struct {
		name     string
		attempt  int
		interval time.Duration
		rnd      float64
		want     time.Duration
	}{
		{"first attempt, no jitter drawn", 0, i, 0, i / 2},
		{"first attempt, mid", 0, i, 0.5, 750 * time.Millisecond},
		{"first attempt, top stays below one interval", 0, i, math.Nextafter(1, 0), i - 1},
		{"second attempt doubles", 1, i, 0, i},
		{"third attempt reaches the cap", 2, i, 0, 2 * i},
		{"cap holds", 50, i, 0.5, 3 * i},
		{"cap holds for huge attempts", math.MaxInt, i, 0, 2 * i},
		{"negative attempt is the first", -3, i, 0, i / 2},
		{"zero interval means the default", 0, 0, 0, DefaultInterval / 2},
		{"negative interval means the default", 1, -i, 0, DefaultInterval},
		{"NaN rnd counts as 0", 0, i, math.NaN(), i / 2},
		{"negative rnd clamps to 0", 0, i, -1, i / 2},
		{"rnd of 1 or more clamps below the ceiling", 0, i, 7, i - 1},
		{"short interval", 2, 10 * time.Millisecond, 0.25, 25 * time.Millisecond},
		{"a 1ns interval still waits", 0, 1, 0.9, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Backoff(tt.attempt, tt.interval, tt.rnd); got != tt.want {
				t.Errorf("Backoff(%d, %v, %v) = %v, want %v", tt.attempt, tt.interval, tt.rnd, got, tt.want)
			}
		})
	}
}

// TestBackoffSpread checks that waiters drawing different rnd spread evenly
// over the whole jitter window, in order, rather than clumping.
func TestBackoffSpread(t *testing.T) {
	const interval = time.Second
	for attempt, window := range [][2]time.Duration{
		{interval / 2, interval},
		{interval, 2 * interval},
		{2 * interval, 4 * interval},
		{2 * interval, 4 * interval},
	} {
		const n = 1000
		buckets := make([]int, 10)
		prev := time.Duration(-1)
		for k := range n {
			d := Backoff(attempt, interval, float64(k)/n)
			if d < window[0] || d >= window[1] {
				t.Fatalf("attempt %d: Backoff = %v, outside [%v, %v)", attempt, d, window[0], window[1])
			}
			if d <= prev {
				t.Fatalf("attempt %d: Backoff not increasing in rnd: %v after %v", attempt, d, prev)
			}
			prev = d
			buckets[int(10*(d-window[0])/(window[1]-window[0]))]++
		}
		for b, c := range buckets {
			if c != n/10 {
				t.Errorf("attempt %d: bucket %d holds %d of %d draws, want %d", attempt, b, c, n, n/10)
			}
		}
	}
}

func TestReconnectDelay(t *testing.T) {
	tests := []struct {
		failures int
		interval time.Duration
		lo, hi   time.Duration // want lo <= d < hi for every rnd
	}{
		{1, time.Second, 500 * time.Millisecond, time.Second},
		{2, time.Second, time.Second, 2 * time.Second},
		{5, time.Second, 8 * time.Second, 16 * time.Second},
		{6, time.Second, 15 * time.Second, 30 * time.Second}, // capped at 30s
		{1000, time.Second, 15 * time.Second, 30 * time.Second},
		{3, time.Minute, 30 * time.Second, time.Minute}, // interval above the cap
	}
	for _, tt := range tests {
		for _, rnd := range []float64{0, 0.3, 0.999999} {
			d := reconnectDelay(tt.failures, tt.interval, rnd)
			if d < tt.lo || d >= tt.hi {
				t.Errorf("reconnectDelay(%d, %v, %v) = %v, want in [%v, %v)", tt.failures, tt.interval, rnd, d, tt.lo, tt.hi)
			}
		}
	}
}

func FuzzBackoff(f *testing.F) {
	f.Add(0, int64(time.Second), 0.0)
	f.Add(3, int64(time.Millisecond), 0.99)
	f.Add(-1, int64(0), 2.0)
	f.Add(math.MaxInt, int64(math.MaxInt64), math.Inf(1))
	f.Add(64, int64(math.MaxInt64/3), math.NaN())
	f.Add(-1, int64(1), 2.0) // a 1ns interval once gave 0
	f.Fuzz(func(t *testing.T, attempt int, interval int64, rnd float64) {
		iv := time.Duration(interval)
		d := Backoff(attempt, iv, rnd)
		if iv <= 0 {
			iv = DefaultInterval
		}
		if d < iv/2 {
			t.Fatalf("Backoff(%d, %v, %v) = %v, below half an interval", attempt, iv, rnd, d)
		}
		if iv <= math.MaxInt64/MaxBackoffIntervals && d >= MaxBackoffIntervals*iv {
			t.Fatalf("Backoff(%d, %v, %v) = %v, at or above %d intervals", attempt, iv, rnd, d, MaxBackoffIntervals)
		}
		if d <= 0 {
			t.Fatalf("Backoff(%d, %v, %v) = %v, not positive", attempt, iv, rnd, d)
		}
	})
}
