// Package health samples PostgreSQL server health for pgtraffic's
// throttle_when budgets: the Vitess-throttler half of traffic control.
//
// It may import driver/rules/vocab (the metric names, the default interval) and nothing else of
// pgtraffic's, pgerrcode (SQLSTATE names), and no database driver: its connection is a [Conn]
// handed in (package pgxconn implements it with pgx), and the engine hands it its settings.
//
// # Sampling
//
// A [Sampler] belongs to one connector. It reads the configured metrics on
// its own dedicated connection (never one of the application's pool), a
// [Conn] that [Options.Connect] opens, once per interval, from a single goroutine driven by a [time.Timer], and
// publishes each round as an immutable snapshot behind an atomic pointer.
// Checks ([Sampler.Evaluate], [Sampler.Value]) read that snapshot and never
// wait for I/O, so the hot path pays a map lookup per threshold.
//
// The sampler opens nothing while no metric is configured: a connector whose
// budgets use no health thresholds costs the server nothing. Every read is
// bounded by a timeout; a failed connect is retried with exponential
// backoff capped at four intervals (at least a second), so that throttling
// on stale health lifts within a few intervals of the server's return.
//
// # One sampler per database
//
// With an [Election] (the engine passes one built on Redis when the rules have a
// coordination section), the samplers of every instance that reads the same database with
// the same metric set (the same metrics, queries and interval: [Ballot]) share one: each
// round first votes. The instance holding the lease ([LeaseIntervals] intervals long,
// renewed by each of its rounds) samples and publishes its readings; the others read them
// instead of the server, keep no connection open, and poll again an eighth of an interval
// after the lead's next sample is due (every quarter interval once it is overdue). A lead
// that closes resigns, and the next poll elects another; a lead that dies is replaced once
// its lease lapses, within LeaseIntervals intervals and a quarter, before the followers'
// readings turn stale. When the election cannot be held (Redis unreachable) a follower whose
// readings are still young polls again, and otherwise every sampler reads the server itself;
// so does one whose election is not ready yet ([ErrNotReady]), without a warning.
//
// What an election returns is untrusted. The election authenticates a sample (package coord
// signs it with a key only readers of the database can derive, and fails the vote on a sample
// not signed with it, so that its sampler reads the server itself); and a reading that is
// missing, failed, out of its metric's range, dated in the future or older than
// [StaleIntervals] intervals is adopted as a failed read, never as a healthy value: as after a
// failed read of its own, the follower keeps its last good value until that is
// [StaleIntervals] intervals old, and the metric is stale (exceeded for enforce budgets) from
// then on. [vocab.MetricInFlight] is never shared.
//
// # Metrics
//
//   - [vocab.MetricActiveQueries]: client backends in state 'active' in pg_stat_activity,
//     the sampler's own backend excluded. The sampling role needs
//     pg_read_all_stats (or pg_monitor) to see other roles' backends; without
//     it the read fails (stale) while one of theirs holds a snapshot or a
//     transaction ID, as one running a statement does, rather than count it
//     as idle. That failure is logged once.
//   - [vocab.MetricReplicationLag]: on a standby, seconds since the last replayed
//     transaction committed on the primary, or 0 while it streams from the
//     primary and has replayed everything received; a standby that is not
//     streaming (cut off, reconnecting, fed from a WAL archive) cannot know it
//     is caught up and reports the age. The sampling role needs pg_monitor (or
//     pg_read_all_stats) to see the WAL receiver's status; without it the read
//     fails (stale). On a primary, the largest replay_lag in
//     pg_stat_replication, or 0 when there is none.
//   - [vocab.MetricInFlight]: the connector's own queries in flight; not sampled, the
//     caller passes it to [Sampler.Evaluate].
//   - [vocab.MetricCustomPrefix] + name: a configured query returning one row with one
//     numeric column ([Conn.ReadNumber]).
//
// # Staleness
//
// A metric is stale when its last good read is older than [StaleIntervals]
// intervals, or when it has none: never read for [StaleIntervals] intervals
// since it was configured, or its reads failed from the start. A read that
// fails after a good one does not make the metric stale: the last good value
// is evaluated until it is [StaleIntervals] intervals old, so that one lost
// connection (a failover proxy, an idle-connection reaper, a terminated
// backend) or one slow round does not throttle every enforce budget while the
// sampler reconnects at its next round. A stale metric counts as exceeded for
// enforce budgets (fail safe) and is logged once when the staleness begins. A
// sample carried over from a sampler at another interval ([Options.Replaces])
// is judged by the interval of the sampler that took it until the new one
// reads. A read that fails is logged once per change of its error and counted
// by [Sampler.Errors].
//
// # Waiting
//
// Batch jobs that wait for health to recover sleep [Backoff] between
// checks: about one interval, growing to four, with jitter, so that many
// waiting jobs do not all rush in the moment a metric drops.
//
// # Imports
//
// Its one job is to keep the health sample that throttle checks read. It imports the
// standard library, driver/rules/vocab (the metric names) and pgerrcode, and no database
// driver or network client: the connection is a [Conn] and the election an [Election], both handed in, so that
// the engine, which reads the sample, knows no driver either. Package pgxconn implements Conn
// with pgx; package coord implements Election on Redis.
package health
