package vocab

import (
	"strconv"
	"time"
)

// Reasons a statement is refused or warned about: which kind of limit of a rules file refused
// it. They are the values of the driver's BlockedError.Reason, of the pgtraffic.reason span and
// metric attribute, and of the reason field of pgtraffic's log records.
const (
	ReasonConcurrency = "concurrency"      // the budget's max_concurrent statements are in flight
	ReasonPerQuery    = FieldPerQueryLimit // the predicted cost exceeds per_query_limit, or burst_limit (it never fits)
	ReasonBudget      = "budget"           // the budget's bucket (server_share, burst_limit) has no room
	ReasonGuard       = "guard"            // a query guard (require_where, block_truncate) refused the statement
	ReasonHealth      = "health"           // a throttle_when health threshold is exceeded
	ReasonQuarantine  = "quarantine"       // the statement's pattern is quarantined (it kept overrunning)

	// ReasonMaxDuration is not a refusal: an admitted statement ran past max_duration (an
	// enforce budget cancelled it; a warn budget warned).
	ReasonMaxDuration = FieldMaxDuration

	// ReasonWarningThreshold is only ever a warning: a limit is fuller than warning_threshold.
	ReasonWarningThreshold = "warning_threshold"
)

// Field names of the rules file that pgtraffic quotes: a refusal's limit names the limit as the
// file spells it ("max_concurrent=4"), and a guard's refusal the guard. The rules config spells
// them in its struct tags, where Go wants a literal; internal/facts checks that each is a
// field of the rules config.
const (
	FieldMaxConcurrent = "max_concurrent"
	FieldPerQueryLimit = "per_query_limit"
	FieldBurstLimit    = "burst_limit"
	FieldServerShare   = "server_share"
	FieldMaxDuration   = "max_duration"
	FieldMaxQueue      = "max_queue"
	GuardRequireWhere  = "require_where"
	GuardBlockTruncate = "block_truncate"
)

// Built-in tag keys: facts of the statement and its connection, which a rule's match may name
// and which comment and context tags cannot replace.
const (
	KeyUsername        = "username"
	KeyDatabase        = "database"
	KeyApplicationName = "application_name"
	KeyFingerprint     = "fingerprint"
	KeyStatement       = "statement"
	KeyTable           = "table"
	KeyQueryName       = "query_name" // from a leading sqlc comment, "-- name: ListOrders :many"
)

// FingerprintHex spells a statement's fingerprint as the built-in fingerprint tag's value, which
// a rule's match names, and as pgtraffic shows and shares it (BlockedError, spans, the status
// page, a shared quarantine in Redis): 16 lower-case hex digits.
func FingerprintHex(id uint64) string {
	s := strconv.FormatUint(id, 16)
	return "0000000000000000"[len(s):] + s
}

// Statement kinds: the values of the built-in statement tag.
const (
	KindSelect  = "select"
	KindInsert  = "insert"
	KindUpdate  = "update"
	KindDelete  = "delete"
	KindMerge   = "merge"
	KindCopy    = "copy"
	KindDDL     = "ddl"
	KindUtility = "utility"
	KindOther   = "other"
)

// Kinds lists the statement kinds, for a rule's match to be checked against.
func Kinds() []string {
	return []string{KindSelect, KindInsert, KindUpdate, KindDelete, KindMerge, KindCopy, KindDDL, KindUtility, KindOther}
}

// Health metrics, as a budget's throttle_when names them.
const (
	MetricActiveQueries  = "active_queries"  // backends active in pg_stat_activity
	MetricReplicationLag = "replication_lag" // seconds; a duration such as "5s" in a rules file
	MetricInFlight       = "in_flight"       // the connector's own statements in flight: counted, not sampled
	MetricCustomPrefix   = "custom."         // followed by a name under health_queries
)

// DefaultHealthInterval is how often the health metrics are sampled when health_interval is
// not set.
const DefaultHealthInterval = time.Second

// MaxHealthInterval is the longest health_interval: it keeps a typo (1000000h) from making
// every sample stale at once (a sample is stale after three intervals, a time that would
// overflow); a server read once a day protects nothing.
const MaxHealthInterval = 24 * time.Hour

// DefaultBurstWindow sizes a budget's bucket when it has a server_share and no burst_limit: the
// bucket holds this long of its drain rate (share × cores × 1s).
const DefaultBurstWindow = time.Second
