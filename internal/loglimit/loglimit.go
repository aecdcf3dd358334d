package loglimit

import (
	"sync"
	"time"
)

// Every is the least time between two log lines of one key. A budget under pressure decides
// thousands of times a second; the log gets one line a second saying how many were
// suppressed, and the metrics count every one.
const Every = time.Second

// maxKeys bounds the keys a Limiter tracks: budgets are few, but a rules file may name a budget
// per tenant.
const maxKeys = 10_000

// Limiter rate-limits log lines per key: at most one a key per Every. The zero value is ready;
// safe for concurrent use.
type Limiter struct {
	mu sync.Mutex // protects m
	m  map[string]*state
}

type state struct {
	last       time.Time
	suppressed int
}

// Allow reports whether to log a line of key at now, and how many lines of key were
// suppressed since the last one logged.
func (l *Limiter) Allow(key string, now time.Time) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.m[key]
	if s == nil {
		if l.m == nil || len(l.m) > maxKeys {
			l.m = map[string]*state{}
		}
		s = &state{}
		l.m[key] = s
	}
	if !s.last.IsZero() && now.Sub(s.last) < Every {
		s.suppressed++
		return false, 0
	}
	n := s.suppressed
	s.last, s.suppressed = now, 0
	return true, n
}
