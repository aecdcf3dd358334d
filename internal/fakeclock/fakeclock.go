package fakeclock

import (
	"sync"
	"time"
)

// Start is where every Clock's time begins.
var Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Clock is a fake clock, safe for concurrent use. Its zero value is not ready: use New.
type Clock struct {
	mu     sync.Mutex // protects t and timers
	t      time.Time
	timers []timer // set and not fired yet
	set    chan Timer
}

// Timer is a timer as it was set: when, and for how long.
type Timer struct {
	At time.Time
	D  time.Duration
}

type timer struct {
	Timer
	c chan time.Time
}

// New returns a clock at Start.
func New() *Clock {
	return &Clock{t: Start, set: make(chan Timer, 1000)}
}

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// After is the fake time.After: its channel receives once Advance passes d from now. Each timer
// set is also announced on Set.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	tm := timer{Timer: Timer{At: c.t.Add(d), D: d}, c: make(chan time.Time, 1)}
	if d <= 0 {
		tm.c <- c.t
	} else {
		c.timers = append(c.timers, tm)
	}
	c.mu.Unlock()
	select {
	case c.set <- tm.Timer:
	default: // a test that reads Set reads it long before a thousand timers are set
	}
	return tm.c
}

// Set receives each timer as After sets it: a test waits on it to know that the code under test
// reached its wait.
func (c *Clock) Set() <-chan Timer { return c.set }

// Advance moves the clock forward by d and fires the timers due.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	kept := c.timers[:0]
	for _, tm := range c.timers {
		if tm.At.After(c.t) {
			kept = append(kept, tm)
			continue
		}
		tm.c <- c.t
	}
	c.timers = kept
}

// Earliest returns how far the earliest pending timer is; false if none is pending.
func (c *Clock) Earliest() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.timers) == 0 {
		return 0, false
	}
	at := c.timers[0].At
	for _, tm := range c.timers[1:] {
		if tm.At.Before(at) {
			at = tm.At
		}
	}
	return at.Sub(c.t), true
}
