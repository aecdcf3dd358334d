package serverclock

import (
	"context"
	"time"
)

// Conn is the reader's own connection to the server. Like a database connection it is not safe
// for concurrent use; the reader uses it from its one goroutine.
type Conn interface {
	// Ping makes one round trip that asks the server for next to nothing.
	Ping(ctx context.Context) error
	// Read returns pg_stat_statements' counters of the top-level statements of the connection's
	// database whose query identifier is one of ids: one row per identifier and role, as the
	// server keeps them.
	Read(ctx context.Context, ids []int64) (Reading, error)
	// IsClosed reports whether the connection is closed (by Close, or broken by a failed call):
	// the reader then opens another.
	IsClosed() bool
	Close(ctx context.Context) error
}

// Reading is one read of pg_stat_statements.
type Reading struct {
	// Reset is when the statistics were last reset as a whole (pg_stat_statements_info); a
	// change discards every baseline.
	Reset time.Time
	// Dealloc is how many times the server has evicted entries to make room for new ones
	// (pg_stat_statements_info.dealloc); a change discards every baseline too, for an evicted
	// entry may have been made anew and outgrown its old counters since the last read.
	Dealloc int64
	Rows    []Row
}

// Row is the cumulative counters of one query identifier as run by one role.
type Row struct {
	QueryID int64
	UserID  uint32 // the role's oid
	Calls   int64
	// ExecMS and PlanMS are the total execution and planning milliseconds (planning is 0
	// unless pg_stat_statements.track_planning is on).
	ExecMS, PlanMS float64
}
