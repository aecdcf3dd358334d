package engine

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/cost"
)

// What the server's clock teaches the engine (package serverclock reads it in the background):
// none of it runs on a statement's path.

// QueryIDs appends to dst the patterns whose server query identifier an EXPLAIN reported, at
// most max of them, the most recently used first.
func (e *Engine) QueryIDs(dst []cost.QueryID, max int) []cost.QueryID {
	return e.model.QueryIDs(dst, max)
}

// Unidentified returns how many EXPLAINs reported no query identifier: the server's clock
// cannot report their patterns.
func (e *Engine) Unidentified() uint64 { return e.model.Unidentified() }

// ObserveServer trains pattern fp on the server's clock: its statements (query identifier id)
// took seconds each on average on the server over the recent reads (package serverclock
// weighs them by their calls). Until until, the pattern's
// predictions are on the server's clock, and each of its statements is charged its prediction
// rather than the client's measurement (Finish). The statements of the pattern charged on the
// client's clock since (its first ones, before any report) are trued up to seconds each. It
// returns nil when the report was taken, else cost.Model.ObserveServer's error: a mean that
// the client's own measurements of the pattern rule out (cost.ErrImplausible) is not taken.
func (e *Engine) ObserveServer(fp uint64, id int64, seconds float64, until time.Time) error {
	now := e.now()
	floor := float64(e.floor.Load()) / 1e9
	if err := e.model.ObserveServer(now, fp, id, seconds, until, floor); err != nil {
		return err
	}
	e.clientCharges.trueUp(now, fp, seconds)
	return nil
}

// Charges on the client's clock, trued up. A pattern's statements are charged the client's
// measurement until the server first reports the pattern (a new pattern, or one whose reports
// lapsed while it did not run), and on a loaded client that is many times what the server
// spent: at a deploy the first lookups of a tight budget would fill its bucket for as long as
// it takes to drain the client's idea of them. So while the server's clock is read, the
// charges Finish makes on the client's clock to patterns the server can report (their query
// identifier is known) are kept, and the pattern's next report trues each up to the server's
// mean (budget.Adjust). Only those are kept: a pattern on the server's clock is charged its
// prediction, from the server's own reports. The table is bounded; a charge that no report
// trues up within trueUpWithin (the pattern was evicted from pg_stat_statements, the reader
// stopped) keeps the client's measurement, as does one that found the table full.
const (
	maxClientCharges = 4096
	trueUpWithin     = time.Minute
)

// clientCharges holds the charges on the client's clock awaiting their pattern's report.
type clientCharges struct {
	// live is until when the server's clock is read (UnixNano; 0: never, see Reading):
	// charges are kept only while it is.
	live atomic.Int64

	mu        sync.Mutex // protects the fields below
	byPattern map[uint64][]clientCharge
	n         int // charges held
}

// clientCharge is one budget's charge of stmts statements of one pattern: one statement's, or
// a batch's share of its statements of the pattern.
type clientCharge struct {
	r       budget.Request // the budget and key charged
	charged float64
	stmts   int
	at      time.Time
}

// wanted reports whether a charge at now is worth keeping: the server's clock is read.
func (c *clientCharges) wanted(now time.Time) bool {
	return now.UnixNano() < c.live.Load()
}

// add keeps the charge of stmts statements of pattern fp, charged to each of holds at now. A full
// table keeps no more until the next Reading, which drops the old ones off the statements'
// path: the charges meanwhile keep the client's measurement, and take no lock.
func (c *clientCharges) add(fp uint64, holds []budget.Request, charged float64, stmts int, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n+len(holds) > maxClientCharges {
		c.live.Store(0)
		return
	}
	if c.byPattern == nil {
		c.byPattern = map[uint64][]clientCharge{}
	}
	cs := c.byPattern[fp]
	for _, r := range holds {
		cs = append(cs, clientCharge{r: budget.Request{Budget: r.Budget, Key: r.Key}, charged: charged, stmts: stmts,
			at: now})
	}
	c.byPattern[fp] = cs
	c.n += len(holds)
}

// expire drops the charges kept longer than trueUpWithin before now.
func (c *clientCharges) expire(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for fp, cs := range c.byPattern {
		kept := cs[:0]
		for _, x := range cs {
			if now.Sub(x.at) < trueUpWithin {
				kept = append(kept, x)
			}
		}
		c.n -= len(cs) - len(kept)
		if len(kept) == 0 {
			delete(c.byPattern, fp)
		} else {
			c.byPattern[fp] = kept
		}
	}
}

// drop drops every charge kept.
func (c *clientCharges) drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.byPattern)
	c.n = 0
}

// trueUp trues the charges kept for pattern fp up to seconds per statement, the server's mean,
// at now.
// The budgets are adjusted after c.mu is released: no lock is held across another.
func (c *clientCharges) trueUp(now time.Time, fp uint64, seconds float64) {
	c.mu.Lock()
	cs := c.byPattern[fp]
	delete(c.byPattern, fp)
	c.n -= len(cs)
	c.mu.Unlock()
	for _, x := range cs {
		if now.Sub(x.at) < trueUpWithin {
			budget.Adjust(now, x.r, float64(x.stmts)*seconds-x.charged)
		}
	}
}

// Reading is told that the server's clock is read, and that until until the patterns whose
// query identifier is known will be reported within about within of running: until then Finish
// keeps the charges it makes on the client's clock to such patterns, for their reports to true
// up. A reader whose reports come later than trueUpWithin could true up none of them, so
// nothing is kept for it. Reading also drops the charges kept too long to be trued up, and all
// of them when until is the zero time (a read failed: no report is coming).
func (e *Engine) Reading(until time.Time, within time.Duration) {
	if until.IsZero() || within > trueUpWithin {
		e.clientCharges.live.Store(0)
		e.clientCharges.drop()
		return
	}
	e.clientCharges.live.Store(until.UnixNano())
	e.clientCharges.expire(e.now())
}

// SetNetworkFloor sets the network's round trip to the server, d, which Finish takes off the
// client's measurement of each statement; d <= 0: none.
func (e *Engine) SetNetworkFloor(d time.Duration) { e.floor.Store(int64(max(d, 0))) }

// NetworkFloor is the round trip SetNetworkFloor set.
func (e *Engine) NetworkFloor() time.Duration { return time.Duration(e.floor.Load()) }
