package engine

import (
	"time"

	"github.com/pgtraffic/pgtraffic/internal/cost"
)

// What the server's clock teaches the engine (package serverclock reads it in the background):
// none of it runs on a statement's path.

// QueryIDs appends to dst the patterns whose server query identifier an EXPLAIN reported, at
// most max of them, the most recently used first.
func (e *Engine) QueryIDs(dst []cost.QueryID, max int) []cost.QueryID {
	return e.model.QueryIDs(dst, max)
}

// ObserveServer trains pattern fp on the server's clock: its statements (query identifier id)
// took seconds each on average on the server since the last report. Until until, the pattern's
// predictions are on the server's clock, and each of its statements is charged its prediction
// rather than the client's measurement (Finish). It reports whether the report was taken.
func (e *Engine) ObserveServer(fp uint64, id int64, seconds float64, until time.Time) bool {
	return e.model.ObserveServer(e.now(), fp, id, seconds, until)
}

// SetNetworkFloor sets the network's round trip to the server, d, which Finish takes off the
// client's measurement of each statement; d <= 0: none.
func (e *Engine) SetNetworkFloor(d time.Duration) { e.floor.Store(int64(max(d, 0))) }

// NetworkFloor is the round trip SetNetworkFloor set.
func (e *Engine) NetworkFloor() time.Duration { return time.Duration(e.floor.Load()) }
