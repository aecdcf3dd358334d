package rules

import (
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// Defaults of [Config.ServerCores] and [Config.HealthInterval] (1 and 1s), which
// [Config.WithDefaults] makes explicit. The health interval is the sampler's own default.
const (
	DefaultServerCores    = 1
	DefaultHealthInterval = vocab.DefaultHealthInterval
)

// DefaultMaxQueue is [Budget.MaxQueue] when it is omitted and the budget has no max_concurrent
// above 0 (with one, the default is max_concurrent): see [Budget.QueueBound].
const DefaultMaxQueue = 8

// Config is a complete rules file: how much the server can take, which budgets exist, which
// queries each budget governs, and the static guards.
//
// The zero value is a valid config with no budgets, no rules and no guards: every query runs.
// A Config is plain data; it is not safe to modify while another goroutine reads it. Code that
// keeps a Config handed to it should keep a [Config.Clone].
type Config struct {
	// ServerCores is how many execution seconds per second the server sustains; budget
	// shares are fractions of it. Zero means the default, 1.
	ServerCores float64 `yaml:"server_cores,omitempty" json:"server_cores,omitempty"`

	// HealthInterval is how often the health sampler reads the server, and the server clock
	// reads pg_stat_statements (see the README's server seconds). Zero means the default, 1s;
	// otherwise between 10ms and 24h.
	HealthInterval Duration `yaml:"health_interval,omitempty" json:"health_interval,omitempty"`

	// HealthQueries names custom health metrics: each query must return a single number,
	// which throttle_when thresholds refer to as custom.<name>. Names use letters, digits,
	// '_' and '-'. A reload that changes a query keeps its metric's last reading in force
	// until the new query is read.
	HealthQueries map[string]string `yaml:"health_queries,omitempty" json:"health_queries,omitempty"`

	// Budgets are the limits queries are checked against. Names are unique.
	Budgets []Budget `yaml:"budgets,omitempty" json:"budgets,omitempty"`

	// Rules route queries to budgets by their tags. A query is checked against the budget
	// of every rule it matches.
	Rules []Rule `yaml:"rules,omitempty" json:"rules,omitempty"`

	// Guards are static checks of the statement itself, independent of budgets.
	Guards Guards `yaml:"guards,omitempty" json:"guards,omitempty"`

	// Coordination, when set, shares budgets across the instances of an application
	// through Redis; nil keeps every budget process-local.
	Coordination *Coordination `yaml:"coordination,omitempty" json:"coordination,omitempty"`
}

// Mode says what a budget or guard does with a query over its limit.
type Mode string

// Modes. The empty Mode means [ModeWarn] for a budget and [ModeOff] for a guard (so a config
// that does not mention guards has none). In a file a mode is left out for that: one written
// as "" is refused, as a template's unset variable would otherwise turn enforce off unseen.
const (
	ModeEnforce Mode = "enforce" // block the query (or wait up to max_wait, then block)
	ModeWarn    Mode = "warn"    // log, count and annotate the span; let the query run
	ModeOff     Mode = "off"     // ignore the budget or guard
)

func (m Mode) valid() bool { return m == "" || m == ModeEnforce || m == ModeWarn || m == ModeOff }

// Explain values of [Budget.Explain]: when to re-run EXPLAIN for a query's planner cost.
const (
	ExplainAuto    = "auto"    // per pattern, per call for patterns whose cost varies widely
	ExplainPattern = "pattern" // one cached cost per pattern
	ExplainCall    = "call"    // every execution
)

// Health metrics that [Budget.ThrottleWhen] may name, as defined in package [vocab], which the
// health sampler shares.
const (
	MetricActiveQueries  = vocab.MetricActiveQueries  // backends active in pg_stat_activity
	MetricReplicationLag = vocab.MetricReplicationLag // seconds; a duration such as "5s" in a file
	MetricInFlight       = vocab.MetricInFlight       // this connector's own queries in flight
	CustomMetricPrefix   = vocab.MetricCustomPrefix   // custom.<name>, a query in Config.HealthQueries
)

// Budget is a named set of limits. Omitted (zero) limits are unlimited. Execution seconds —
// the seconds one backend spends on a query, as pg_stat_statements reports them where it is
// readable, else as the client measures them less the network's round trip — are the unit of
// cost; durations express them.
// A Budget with only a name is valid: a warn budget with no limits, which counts the queries
// its rules route to it.
type Budget struct {
	// Name identifies the budget in rules, errors, metrics and across reloads. Required.
	Name string `yaml:"name" json:"name"`

	// Mode is enforce, warn (the default when empty) or off.
	Mode Mode `yaml:"mode,omitempty" json:"mode,omitempty"`

	// MaxConcurrent caps the budget's statements in flight at once. A statement holds its
	// slot until Exec returns or its rows are closed, and releases it on errors,
	// cancellation and broken connections. nil means no limit; 0 admits nothing (reason
	// concurrency, a zero RetryAfter): a rule to such a budget blocks what it matches when the
	// budget is in enforce mode, and only warns about it in warn mode.
	MaxConcurrent *int `yaml:"max_concurrent,omitempty" json:"max_concurrent,omitempty"`

	// PerQueryLimit caps the predicted cost of one statement. Waiting cannot help a
	// statement over it, so its BlockedError's RetryAfter is zero.
	PerQueryLimit Duration `yaml:"per_query_limit,omitempty" json:"per_query_limit,omitempty"`

	// ServerShare is the long-run fraction, in [0, 1], of ServerCores the budget may use.
	// It makes a reverse leaky bucket: each statement adds its cost as debt, the debt
	// drains at ServerShare × ServerCores execution seconds per second, and a statement
	// is refused when debt plus its predicted cost exceeds BurstLimit. The debt is
	// corrected to the actual execution time when the statement completes. nil means no
	// limit; 0 admits nothing (reason budget, a zero RetryAfter) in enforce mode, and only
	// warns in warn mode.
	ServerShare *float64 `yaml:"server_share,omitempty" json:"server_share,omitempty"`

	// BurstLimit is the bucket size in execution seconds. It needs a ServerShare above 0; the default
	// is ServerShare × ServerCores × 1s. A statement predicted to cost more can never fit:
	// it is refused with reason per_query_limit and a zero RetryAfter (but see the README on
	// probes: a pattern refused so runs one statement, bounded by the limit, every 10 s).
	BurstLimit Duration `yaml:"burst_limit,omitempty" json:"burst_limit,omitempty"`

	// WarningThreshold, in (0, 1), warns (even in enforce mode) when any limit is this
	// full after a statement is admitted.
	WarningThreshold float64 `yaml:"warning_threshold,omitempty" json:"warning_threshold,omitempty"`

	// Per names a tag key: a separate bucket and concurrency count per value of that tag.
	// A statement without the tag counts under the empty value. The number of values
	// kept is bounded (the driver's WithMaxBuckets); past it, idle values are forgotten
	// first.
	Per string `yaml:"per,omitempty" json:"per,omitempty"`

	// MaxWait is how long an enforce budget lets a statement wait for a slot, bucket room
	// or health before blocking it; the statement's context bounds it too. Zero: no
	// waiting. A warn budget warns only about the statements it would block after such a
	// wait, or with its queue full (see the package documentation).
	MaxWait Duration `yaml:"max_wait,omitempty" json:"max_wait,omitempty"`

	// MaxQueue is how many statements may wait at once under MaxWait, per budget and per
	// value of Per. Statements waiting for capacity wait in a queue per budget and value and
	// are admitted in arrival order; a statement that finds the queue full is refused at
	// once, with a RetryAfter. nil means the default (see [Budget.QueueBound]):
	// MaxConcurrent when that is set above 0, else [DefaultMaxQueue]. 0 lets no statement
	// wait: each is refused at once, as without MaxWait. It needs MaxWait.
	MaxQueue *int `yaml:"max_queue,omitempty" json:"max_queue,omitempty"`

	// ThrottleWhen maps health metrics (the Metric constants, or custom.<name>) to
	// thresholds: while any is reached the budget admits nothing. replication_lag is in
	// seconds. For an enforce budget a sample older than three health intervals counts as
	// reached. active_queries needs a role with pg_read_all_stats (or pg_monitor) to see other
	// roles' backends: without it, its read fails while one of theirs runs a statement, and
	// its sample turns stale.
	ThrottleWhen map[string]float64 `yaml:"throttle_when,omitempty" json:"throttle_when,omitempty"`

	// Explain says when EXPLAIN runs to predict a statement's cost: pattern, once per
	// pattern (and again after a minute); call, for every execution; auto (the default
	// when empty), per pattern, but per call for patterns whose cost varies widely (where the
	// statement holds its connection: driver.NewPool's statements, decided before they take
	// one, are priced by the pattern's latest plan). With
	// several budgets the most eager wins. In a file, explain: "" is refused (leave it out).
	Explain string `yaml:"explain,omitempty" json:"explain,omitempty"`

	// Shared says whether the budget's limits hold across every instance (see
	// [Coordination]). nil means true when the config has a coordination section; true
	// without one is an error. The per-query limit, warnings and throttling stay local.
	Shared *bool `yaml:"shared,omitempty" json:"shared,omitempty"`

	// MaxDuration bounds how long an admitted statement may run, its rows included, until
	// they are closed: past it an enforce budget cancels the statement on the server (as a
	// context deadline does) and its error matches the driver's ErrOverrun and
	// context.DeadlineExceeded, and names the budget and the bound; a warn budget only warns
	// (each warn budget about a statement past its own bound). With several budgets the
	// smallest bound applies; a pgx batch runs under the smallest bound of its statements, from
	// its admission to the close of its results. A statement keeps the bound it was admitted
	// under: a reload bounds the statements admitted after it. Zero: no bound.
	MaxDuration Duration `yaml:"max_duration,omitempty" json:"max_duration,omitempty"`

	// Quarantine, when set, refuses for a while the patterns that keep overrunning: see
	// [Quarantine]. It needs MaxDuration or PerQueryLimit, whose overruns it counts.
	Quarantine *Quarantine `yaml:"quarantine,omitempty" json:"quarantine,omitempty"`
}

// QueueBound returns how many statements may wait at once under the budget's max_wait, per
// value of Per: MaxQueue when it is set, else MaxConcurrent when that is set above 0, else
// [DefaultMaxQueue].
//
// The default follows max_concurrent because under database/sql a waiting statement holds its
// pool connection: one budget's statements hold at most max_concurrent + max_queue
// connections, which the default makes 2 × max_concurrent, besides, at a deploy, the
// statements of a new pattern waiting for its first EXPLAIN (one round trip, or as long as
// that EXPLAIN waits on a lock). A queue longer than the slots
// mostly fills with statements that wait out their max_wait anyway, since each slot admits
// one waiter per statement time. For a budget with no max_concurrent, 8 keeps the waiters
// below a typical application pool.
func (b *Budget) QueueBound() int {
	switch {
	case b.MaxQueue != nil:
		return *b.MaxQueue
	case b.MaxConcurrent != nil && *b.MaxConcurrent > 0:
		return *b.MaxConcurrent
	}
	return DefaultMaxQueue
}

// Quarantine is a budget's quarantine: a pattern (a fingerprint) whose statements overran the
// budget's max_duration, or whose measured cost exceeded its per_query_limit, After times
// within For is refused by the budget for For (reason quarantine, RetryAfter the time left);
// a warn budget counts the overruns but refuses nothing. Statements of the pattern that ran
// together overrun once: one that began before the pattern's last overrun counts none, so
// that a stall of the server, which cuts every statement in flight at once, does not
// quarantine a quick pattern that happened to be busy. Each instance counts its own overruns;
// a shared budget shares the quarantines they lead to through Redis (see "Shared budgets" in
// the package documentation). A reload that changes a budget's quarantine lifts its
// quarantines.
type Quarantine struct {
	// After is how many overruns within For quarantine a pattern; at least 1.
	After int `yaml:"after" json:"after"`
	// For is both the window overruns are counted in and how long the quarantine lasts.
	For Duration `yaml:"for" json:"for"`
}

// Rule routes the queries whose tags hold every pair of Match to Budget.
//
// A Match value that is a CIDR prefix (203.0.113.0/24, 2001:db8::/32) matches tag values
// that are IP addresses inside it (also written "ip:port", "[ip]:port" or IPv4-mapped as
// ::ffff:a.b.c.d); any other value matches the tag value exactly. A value is taken for a
// prefix when the text before its '/' is shaped like an IPv4 address (digits and dots) or an
// IPv6 one (hex digits and colons); it must then be a valid prefix. Other values containing
// '/' (routes such as /api/export) are exact values. IPv4 addresses match IPv4 prefixes, also
// when written IPv4-mapped (::ffff:203.0.113.0/120); other IPv6 prefixes, ::/0 included, match
// only IPv6 addresses.
//
// The zero Rule is not valid: a rule needs a budget and at least one pair.
type Rule struct {
	// Budget names the budget (a [Budget.Name]) that the matching statements are checked
	// against. Required.
	Budget string `yaml:"budget" json:"budget"`

	// Match maps tag keys (app, controller, username, table, remote_address, ...) to the
	// value each must have, or to a CIDR prefix its address must lie in. Every pair must
	// hold. Required: at least one pair.
	Match map[string]string `yaml:"match" json:"match"`

	// Until, when set, is when the rule lapses: from then on it selects nothing, without a
	// reload (an emergency rule that lifts itself). In a file, an RFC 3339 time such as
	// 2026-12-02T10:00:00Z. A rule already past its Until is valid and does nothing.
	Until time.Time `yaml:"until,omitempty" json:"until,omitzero"`
}

// Lapsed reports whether the rule has an Until that now has reached.
func (r *Rule) Lapsed(now time.Time) bool { return !r.Until.IsZero() && !now.Before(r.Until) }

// String renders the rule's match as sorted key=value pairs joined by commas, e.g.
// "app=commerce,controller=export": a stable name for the rule in errors and telemetry.
func (r *Rule) String() string {
	var small [8]string // a rule's few keys, sorted without a heap slice
	keys := small[:0]
	n := 0
	for k, v := range r.Match {
		keys = append(keys, k)
		n += len(k) + len(v) + 2
	}
	slices.Sort(keys)
	var sb strings.Builder
	sb.Grow(n)
	for i, k := range keys {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(k)
		sb.WriteByte('=')
		sb.WriteString(r.Match[k])
	}
	return sb.String()
}

// Guards are static checks of statements, as pg_strict and Airbnb's query blocklist do.
// The zero value turns both off.
type Guards struct {
	// RequireWhere rejects an UPDATE, DELETE or MERGE whose condition does not restrict the
	// rows of the table it writes: a WHERE passes only if it references a column of that
	// table in a way that can be false for some row (see the package documentation).
	RequireWhere Guard `yaml:"require_where,omitempty" json:"require_where,omitempty"`
	// BlockTruncate rejects TRUNCATE.
	BlockTruncate Guard `yaml:"block_truncate,omitempty" json:"block_truncate,omitempty"`
}

// Guard is one static guard: its mode and, optionally, the tags that scope it (every pair
// must hold, as in a [Rule]; an empty Match means every query). The empty Mode means off;
// a Match needs an explicit Mode.
//
// In a file a guard is written either as its mode alone (require_where: enforce) or as
// a mapping (require_where: {mode: enforce, match: {app: web}}).
type Guard struct {
	// Mode is enforce (refuse the statement), warn (log and count it) or off (the default
	// when empty).
	Mode Mode `yaml:"mode,omitempty" json:"mode,omitempty"`

	// Match limits the guard to the statements whose tags hold every pair, as [Rule.Match]
	// does. Empty: every statement.
	Match map[string]string `yaml:"match,omitempty" json:"match,omitempty"`
}

// guardLong has Guard's fields without its marshalling methods.
type guardLong Guard

// MarshalYAML writes the short form when the guard has no scope.
func (g Guard) MarshalYAML() (any, error) {
	if len(g.Match) == 0 {
		return string(g.Mode), nil
	}
	return guardLong(g), nil
}

// MarshalJSON writes the short form when the guard has no scope.
func (g Guard) MarshalJSON() ([]byte, error) {
	if len(g.Match) == 0 {
		return marshalJSON(string(g.Mode))
	}
	return marshalJSON(guardLong(g))
}

// Clone returns a deep copy of c.
func (c *Config) Clone() *Config {
	out := *c
	out.HealthQueries = maps.Clone(c.HealthQueries)
	out.Budgets = slices.Clone(c.Budgets)
	for i := range out.Budgets {
		b := &out.Budgets[i]
		b.ThrottleWhen = maps.Clone(b.ThrottleWhen)
		b.MaxConcurrent = clonePtr(b.MaxConcurrent)
		b.MaxQueue = clonePtr(b.MaxQueue)
		b.ServerShare = clonePtr(b.ServerShare)
		b.Quarantine = clonePtr(b.Quarantine)
	}
	out.Rules = slices.Clone(c.Rules)
	for i := range out.Rules {
		out.Rules[i].Match = maps.Clone(out.Rules[i].Match)
	}
	out.Guards.RequireWhere.Match = maps.Clone(c.Guards.RequireWhere.Match)
	out.Guards.BlockTruncate.Match = maps.Clone(c.Guards.BlockTruncate.Match)
	cloneCoordination(&out, c)
	return &out
}

// WithDefaults returns a deep copy of c with every default made explicit: server_cores 1,
// health_interval 1s, budget mode warn, explain auto, guard mode off, and with a coordination
// section sync_interval 1s and fallback_instances 10 (what [Parse] fills in), and also the
// defaults that follow from other fields: burst_limit share × cores × 1s where a share is set,
// max_queue [Budget.QueueBound] where max_wait is set, and shared true with a coordination
// section. Empty maps and slices become nil, so that equal configs are reflect.DeepEqual. It
// does not validate; call it on a valid config.
//
// The result shows what is in force. A program that goes on to change it should change the
// fields those last defaults follow together with them: without its coordination section,
// for one, a budget that says shared: true is invalid.
func (c *Config) WithDefaults() *Config {
	out := c.Clone()
	out.fillDefaults()
	out.fillDependentDefaults()
	return out
}

// fillDefaults fills in, in place, the defaults that follow from no other field: what [Parse]
// returns.
func (c *Config) fillDefaults() {
	if c.ServerCores == 0 {
		c.ServerCores = DefaultServerCores
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = Duration(DefaultHealthInterval)
	}
	c.HealthQueries = nilIfEmpty(c.HealthQueries)
	if len(c.Budgets) == 0 {
		c.Budgets = nil
	}
	for i := range c.Budgets {
		b := &c.Budgets[i]
		if b.Mode == "" {
			b.Mode = ModeWarn
		}
		if b.Explain == "" {
			b.Explain = ExplainAuto
		}
		b.ThrottleWhen = nilIfEmpty(b.ThrottleWhen)
	}
	if len(c.Rules) == 0 {
		c.Rules = nil
	}
	for _, g := range []*Guard{&c.Guards.RequireWhere, &c.Guards.BlockTruncate} {
		if g.Mode == "" {
			g.Mode = ModeOff
		}
		g.Match = nilIfEmpty(g.Match)
	}
	c.coordinationDefaults()
}

// fillDependentDefaults fills in, in place, the defaults that follow from other fields:
// burst_limit from server_share and server_cores, max_queue from max_wait and max_concurrent,
// shared from the coordination section. [Parse] leaves them omitted: made explicit, each would
// outlive a change in code to the fields it follows, and be taken for the author's (shared:
// true left behind by a coordination section removed for a run without Redis is an error; a
// burst_limit left behind by a changed server_share is a different bucket). Omitted, they are
// read where they apply ([Budget.QueueBound], [Config.IsShared], and the budget's bucket).
func (c *Config) fillDependentDefaults() {
	for i := range c.Budgets {
		b := &c.Budgets[i]
		if b.BurstLimit == 0 && b.ServerShare != nil && *b.ServerShare > 0 {
			b.BurstLimit = defaultBurst(*b.ServerShare, c.ServerCores)
		}
		if b.MaxQueue == nil && b.MaxWait > 0 {
			b.MaxQueue = new(b.QueueBound())
		}
		if b.Shared == nil && c.Coordination != nil {
			b.Shared = new(true)
		}
	}
}

// defaultBurst is share × cores × 1s ([vocab.DefaultBurstWindow]), at least 1ns
// so that a tiny share still has a bucket.
func defaultBurst(share, cores float64) Duration {
	d := math.Round(share * cores * float64(vocab.DefaultBurstWindow))
	switch {
	case d < 1:
		return 1
	case d > math.MaxInt64:
		return Duration(math.MaxInt64)
	}
	return Duration(d)
}

// clonePtr returns a pointer to a copy of *p, or nil.
func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

func nilIfEmpty[M ~map[K]V, K comparable, V any](m M) M {
	if len(m) == 0 {
		return nil
	}
	return m
}

// DefaultMaxFileSize is the largest rules file read when none is set (the driver's
// WithMaxRulesFileSize), in bytes: room for a generated file of a budget and a rule for each
// of a hundred thousand tenants, about 16 MB as JSON. A larger file is refused unread.
const DefaultMaxFileSize = 32 << 20
