package driver

import (
	"log/slog"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// An Option configures a [Connector]. Options are applied in order; later ones win.
type Option func(*options)

// options is the unexported configuration behind the Option functions. Its zero value is the
// defaults: a zero bound means the default of the package that applies it, named once there.
type options struct {
	rulesFile        string
	rulesFileSet     bool  // WithRulesFile came after any WithConfig: an empty path is an error
	configSet        bool  // WithConfig came after any WithRulesFile: a nil Config is an error
	maxRulesFileSize int64 // 0: rules.DefaultMaxFileSize
	config           *Config
	tracerProvider   trace.TracerProvider
	meterProvider    metric.MeterProvider
	logger           *slog.Logger
	patternCacheSize int // <= 0: pattern.DefaultMaxEntries
	maxBuckets       int // <= 0: budget.DefaultMaxKeys
	pgxOptions       []stdlib.OptionOpenDB
	sqlCommenter     bool
	redis            redis.UniversalClient
}

// WithRulesFile loads the rules from a YAML or JSON file and watches it: a valid change is in
// force within a second, an invalid one is logged and the last good rules stay. Only a complete
// file is applied: one left unchanged for 0.6s and read the same twice (renaming a finished file
// into place is the atomic way). The watch survives its directory being removed and re-created.
// A missing or invalid file at start makes [NewConnector] and [Open] fail, as does an empty
// path (an unset environment variable would otherwise run without rules): leave the option out
// to run without rules.
func WithRulesFile(path string) Option {
	return func(o *options) { o.rulesFile, o.rulesFileSet, o.config, o.configSet = path, true, nil, false }
}

// WithMaxRulesFileSize sets the largest rules file that [WithRulesFile] reads, in bytes; the
// default is 32 MiB (rules.DefaultMaxFileSize). Only a regular file is read (a symlink is
// followed): a larger file, a FIFO or a device is refused unread, at start as an error of
// [NewConnector], on a reload as an invalid file.
func WithMaxRulesFileSize(n int64) Option {
	return func(o *options) { o.maxRulesFileSize = n }
}

// WithConfig sets the rules from a [Config] built in code or by [ParseConfig]. Use
// [Connector.SetConfig] to change them later: pgtraffic keeps a copy of cfg, so changing cfg
// itself changes nothing. A nil cfg (what an unchecked ParseConfig error leaves) makes
// [NewConnector], [Open] and [NewPool] fail: leave the option out to run without rules.
func WithConfig(cfg *Config) Option {
	return func(o *options) { o.config, o.configSet, o.rulesFile, o.rulesFileSet = cfg, true, "", false }
}

// WithTracerProvider sets the OpenTelemetry tracer provider. The default is the global one
// (otel.GetTracerProvider), read when the connector is created.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracerProvider = tp }
}

// WithMeterProvider sets the OpenTelemetry meter provider. The default is the global one.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(o *options) { o.meterProvider = mp }
}

// WithLogger sets the logger for warn and block decisions, reloads and health problems.
// The default is slog.Default(). Logs never contain SQL literals or bound values.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// WithPatternCacheSize bounds the number of distinct statement patterns remembered
// (default 10,000; n <= 0 is the default). Each entry holds a statement's normalised text and
// analysis; the same bound applies to the statement texts cached in front of them and to the
// patterns whose cost is learned.
func WithPatternCacheSize(n int) Option {
	return func(o *options) { o.patternCacheSize = n }
}

// WithMaxBuckets bounds the number of per-tag-value buckets each budget keeps (default 100,000;
// n <= 0 is the default).
// When the table is full, empty buckets are evicted first, then the one that will be empty soonest.
func WithMaxBuckets(n int) Option {
	return func(o *options) { o.maxBuckets = n }
}

// WithPgxOptions passes options to pgx's stdlib connector (for example
// stdlib.OptionBeforeConnect or stdlib.OptionAfterConnect), so pgx hooks keep working. They
// apply to pgtraffic's own connections too (the health sampler's, the server clock reader's),
// so that a password or token set per connection by OptionBeforeConnect reaches them; on the
// pgx-native pool, pgxpool.Config.BeforeConnect does the same.
func WithPgxOptions(opts ...stdlib.OptionOpenDB) Option {
	return func(o *options) { o.pgxOptions = append(o.pgxOptions, opts...) }
}

// WithSQLCommenter appends each statement's context tags and, when its span is sampled, its W3C
// traceparent to the SQL text as a sqlcommenter comment, so server-side tools (pg_stat_activity,
// logs) see them: each statement of a pgx batch too, with its own span's traceparent (the
// batch is sent as a copy; the caller's keeps its texts). Bound values are never included; a
// statement that already has a comment is sent unchanged; prepared statements are not
// rewritten, nor a one-word text (a name prepared through PoolConn.Conn, COMMIT).
//
// Off by default: a per-request traceparent makes every text unique, so pgx's statement cache
// prepares a new statement for each (BenchmarkSQLCommenter in integration/ measures the cost).
// If you turn it on, prefer pgx's default_query_exec_mode=exec or a low sampling ratio.
func WithSQLCommenter(on bool) Option {
	return func(o *options) { o.sqlCommenter = on }
}

// WithRedisClient gives the connector the Redis client its shared budgets coordinate through
// (the rules' coordination section): a *redis.Client, a Sentinel failover client or a
// *redis.ClusterClient, which the section's redis:// URL cannot describe. It replaces the
// section's URL; the connector never closes it. Without a coordination section it is unused.
//
// Set ContextTimeoutEnabled on it and keep MaxRetries low: each sync has a deadline of a
// quarter of sync_interval, at least 100ms (doubling after failed syncs, up to four times),
// and the connector retries on its own schedule. While Redis is down, go-redis itself logs a "failed to dial" line about once per retry (every 0.5 to 1.5
// sync intervals) through its package-wide logger; pgtraffic leaves that logger alone, since
// it is the application's, and logs one line of its own when Redis becomes unreachable and
// one when it is back. redis.SetLogger quiets go-redis if you wish.
func WithRedisClient(c redis.UniversalClient) Option {
	return func(o *options) { o.redis = c }
}
