package health

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
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
		{"zero interval means the default", 0, 0, 0, vocab.DefaultHealthInterval / 2},
		{"negative interval means the default", 1, -i, 0, vocab.DefaultHealthInterval},
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
		{3, time.Second, 2 * time.Second, 4 * time.Second},
		{5, time.Second, 2 * time.Second, 4 * time.Second}, // capped at four intervals
		{1000, time.Second, 2 * time.Second, 4 * time.Second},
		{1, 200 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond},
		{1000, 200 * time.Millisecond, 500 * time.Millisecond, time.Second}, // capped at the 1s floor
		{1000, 10 * time.Millisecond, 500 * time.Millisecond, time.Second},  // a short interval does not dial 25 times a second
		{3, time.Minute, 2 * time.Minute, 4 * time.Minute},                  // a long interval: four of them
		{1000, math.MaxInt64 / 2, math.MaxInt64 / 4, math.MaxInt64/2 + 1},   // no overflow
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

// TestRecoveryAfterOutage replays a long outage: with a 200ms interval and the server down
// for 40s, the sampler used to back off to 30s between connects and so stayed disconnected (every
// metric stale, enforce budgets throttled) for up to 30s after the server came back. Its first
// connect after the server's return must come within the reconnect ceiling.
func TestRecoveryAfterOutage(t *testing.T) {
	const interval = 200 * time.Millisecond
	log, _ := newLogger()
	clock := fakeclock.New()
	back := t0.Add(40 * time.Second)
	var dials []time.Time // read and written by the test's goroutine only (rounds run on it)
	s := NewSampler(Options{
		Connect: func(ctx context.Context) (Conn, error) {
			dials = append(dials, clock.Now())
			return nil, errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
		},
		Interval: interval,
		Metrics:  []string{vocab.MetricActiveQueries},
		Logger:   log,
		Now:      clock.Now,
	})
	defer s.Close()
	// The loop's rounds, one per interval, until a connect is attempted after the server's return.
	for clock.Now().Before(back.Add(time.Minute)) {
		_, _ = s.round(context.Background(), false)
		if n := len(dials); n > 0 && !dials[n-1].Before(back) {
			break
		}
		clock.Advance(interval)
	}
	first := dials[len(dials)-1]
	if first.Before(back) {
		t.Fatalf("no connect attempted in the minute after the server came back")
	}
	// The ceiling for a 200ms interval: four intervals, raised to the one-second floor.
	const ceiling = time.Second
	if late := first.Sub(back); late > ceiling {
		t.Errorf("first connect %v after the server came back, want within %v", late, ceiling)
	}
	// ...without hammering the server while it was down: once the back-off reached its
	// ceiling, at most one dial per half ceiling.
	if limit := int(40*time.Second/(ceiling/2)) + 10; len(dials) > limit {
		t.Errorf("%d connects during a 40s outage, want at most %d", len(dials), limit)
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
			iv = vocab.DefaultHealthInterval
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
