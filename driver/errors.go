package driver

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/engine"
)

// Reasons a statement is blocked, as found in [BlockedError.Reason]. Their values are defined in
// package [vocab], which the budget core shares.
const (
	ReasonConcurrency = vocab.ReasonConcurrency // the budget's max_concurrent statements are in flight
	ReasonPerQuery    = vocab.ReasonPerQuery    // its predicted cost exceeds per_query_limit, or the whole burst_limit (it never fits)
	ReasonBudget      = vocab.ReasonBudget      // the budget's bucket (server_share, burst_limit) has no room
	ReasonGuard       = vocab.ReasonGuard       // a query guard (require_where, block_truncate) refused it
	ReasonHealth      = vocab.ReasonHealth      // a throttle_when health threshold is exceeded
	ReasonQuarantine  = vocab.ReasonQuarantine  // its pattern is quarantined: it kept overrunning
	// ReasonMaxDuration is the pgtraffic.reason of a statement cancelled (or, in warn mode,
	// warned about) for running past its budget's max_duration; it is never a BlockedError's.
	ReasonMaxDuration = vocab.ReasonMaxDuration
)

// ErrOverrun is what the error of a statement that ran past its budget's max_duration matches
// (errors.Is), as it matches context.DeadlineExceeded: pgtraffic cancelled it on the server.
// A probe of a pattern refused as too costly (see the README) runs with the limit it was
// refused for as its max_duration.
// It may well have changed data (an UPDATE cancelled half-way is rolled back, but one that had
// committed is not): unlike a [*BlockedError] it is no proof that nothing ran.
var ErrOverrun = engine.ErrOverrun

// ErrClosed is the error of a statement or batch that was waiting for capacity (a budget's
// max_wait) when its [Pool] or its [Connector] (its *sql.DB) was closed: nothing was sent. A
// batch job's Wait and Check return it too once the Pool or Connector is closed, and so does a
// closed Connector asked for a connection (a *sql.DB opened on it after its close), and a
// closed Pool asked to run a statement, a batch or a copy, which it does not decide.
var ErrClosed = engine.ErrClosed

// ErrBlocked is the sentinel every [*BlockedError] matches with errors.Is.
var ErrBlocked = errors.New("pgtraffic: statement blocked")

// BlockedError reports a statement that pgtraffic refused before sending it to the server.
//
// Budget names the budget (or guard) that refused it, Rule the rule that selected the budget
// (for guards, the guard's name), Reason one of the Reason constants, Fingerprint the statement's
// pattern, and RetryAfter when capacity is expected again (zero when waiting cannot help, as for
// per_query_limit, guards and a zero max_concurrent or server_share; for a quarantine, the time
// it has left, and for a zero limit selected by a rule with an until, the time until it lapses).
type BlockedError struct {
	Budget, Rule, Reason, Fingerprint string
	RetryAfter                        time.Duration

	// Limit describes the limit that was hit, e.g. "max_concurrent=4".
	Limit string
}

// Error names the budget, the reason and the limit. It never contains SQL text or values.
func (e *BlockedError) Error() string {
	msg := fmt.Sprintf("pgtraffic: statement blocked by %s %q (reason %s", e.kind(), e.Budget, e.Reason)
	if e.Limit != "" {
		msg += ", " + e.Limit
	}
	if e.Fingerprint != "" { // none for Check's refusals: no statement was named
		msg += ", fingerprint " + e.Fingerprint
	}
	if e.RetryAfter > 0 {
		msg += ", retry after " + e.RetryAfter.String()
	}
	return msg + ")"
}

func (e *BlockedError) kind() string {
	if e.Reason == ReasonGuard {
		return "guard"
	}
	return "budget"
}

// Is makes errors.Is(err, ErrBlocked) true.
func (e *BlockedError) Is(target error) bool { return target == ErrBlocked }

// SafeToRetry returns true: a blocked statement was refused before anything was sent to the
// server, so running it again cannot apply it twice. pgconn.SafeToRetry(err) and retry helpers
// built on it therefore treat a [*BlockedError] as retryable; wait [BlockedError.RetryAfter]
// first (zero means waiting cannot help: a per_query_limit, a guard or a zero limit
// (max_concurrent: 0, server_share: 0) refused the statement, and will refuse it again).
func (e *BlockedError) SafeToRetry() bool { return true }

// SQLState returns "53000" (insufficient_resources), the code PlanetScale's Traffic Control uses,
// so code that inspects SQLSTATEs can treat a blocked statement like a server-side refusal.
func (e *BlockedError) SQLState() string { return pgerrcode.InsufficientResources }
