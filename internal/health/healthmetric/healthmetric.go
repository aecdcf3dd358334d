// Package healthmetric names the health metrics a budget's throttle_when may use, and how often
// they are sampled unless health_interval says otherwise. This is the one definition of both:
// driver/rules (which validates and documents a rules file) and internal/health (which samples
// the server) refer to it. It is a package of its own, importing nothing, so that the public
// config package does not depend on the sampler or on pgx, and the sampler not on the config.
package healthmetric

import "time"

// Metric names, as written under throttle_when.
const (
	ActiveQueries  = "active_queries"  // backends active in pg_stat_activity
	ReplicationLag = "replication_lag" // seconds; a duration such as "5s" in a rules file
	InFlight       = "in_flight"       // the connector's own statements in flight: counted, not sampled
	CustomPrefix   = "custom."         // followed by a name under health_queries
)

// DefaultInterval is how often the health metrics are sampled when health_interval is not set.
const DefaultInterval = time.Second
