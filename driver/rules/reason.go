package rules

import "github.com/pgtraffic/pgtraffic/internal/budget"

// Reasons a statement is blocked or warned about: which kind of limit of a rules file refused
// it. They are the values of the driver's BlockedError.Reason, of the pgtraffic.reason span and
// metric attribute, and of the reason field of pgtraffic's log records. This is their one
// definition, but for the three a budget itself decides, whose literals are in internal/budget
// (the lowest layer, which imports nothing of pgtraffic's); the driver and the engine refer to
// these constants.
const (
	ReasonConcurrency = budget.ReasonConcurrency // the budget's max_concurrent statements are in flight
	ReasonPerQuery    = budget.ReasonPerQuery    // the statement's predicted cost exceeds per_query_limit, or burst_limit (it never fits)
	ReasonBudget      = budget.ReasonBudget      // the budget's bucket (server_share, burst_limit) has no room
	ReasonGuard       = "guard"                  // a query guard (require_where, block_truncate) refused the statement
	ReasonHealth      = "health"                 // a throttle_when health threshold is exceeded
	ReasonQuarantine  = "quarantine"             // the statement's pattern is quarantined (it kept overrunning)

	// ReasonMaxDuration is not a refusal: an admitted statement ran past max_duration (an
	// enforce budget cancelled it; a warn budget warned).
	ReasonMaxDuration = "max_duration"

	// ReasonWarningThreshold is only ever a warning: a limit is fuller than warning_threshold.
	ReasonWarningThreshold = "warning_threshold"
)
