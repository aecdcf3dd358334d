package health

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// logBuffer captures a logger's output for assertions; safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex // protects buf
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// count returns how many logged lines contain sub.
func (l *logBuffer) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for line := range strings.Lines(l.buf.String()) {
		if strings.Contains(line, sub) {
			n++
		}
	}
	return n
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func newLogger() (*slog.Logger, *logBuffer) {
	b := &logBuffer{}
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}

// fakeClock is an injected clock; safe for concurrent use.
type fakeClock struct {
	mu sync.Mutex // protects t
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// seed publishes a good reading of metric, as a round would.
func seed(tb testing.TB, s *Sampler, metric string, v float64, at time.Time) {
	tb.Helper()
	sql, ok := s.config().defs[metric]
	if !ok {
		tb.Fatalf("seed: %s is not configured", metric)
	}
	s.publish([]result{{metric: metric, sql: sql, value: v, at: at}})
}

// fail publishes a failed read of metric, as a round would.
func fail(tb testing.TB, s *Sampler, metric, why string) {
	tb.Helper()
	sql, ok := s.config().defs[metric]
	if !ok {
		tb.Fatalf("fail: %s is not configured", metric)
	}
	s.publish([]result{{metric: metric, sql: sql, err: why, report: true}})
}
