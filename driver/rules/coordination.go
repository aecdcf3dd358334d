package rules

import (
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Limits of [Coordination.SyncInterval].
const (
	// MinSyncInterval keeps Redis load bounded: each instance makes one call per shared
	// budget per interval, and a sync's deadline is a quarter of it, at least 100ms (doubling
	// after failed syncs, up to four times).
	MinSyncInterval = 100 * time.Millisecond
	// MaxSyncInterval bounds how long a crashed instance holds its slots (within three intervals).
	MaxSyncInterval = time.Minute
)

// DefaultSyncInterval is the sync interval when none is set.
const DefaultSyncInterval = time.Second

// Coordination makes budgets shared by every instance of an application: their limits hold
// across instances, coordinated through Redis, while each statement's decision stays local.
// A Config without one keeps every budget process-local.
//
// The zero value is valid: it coordinates through the client given in code
// (driver.WithRedisClient) every sync_interval (1s). Format a Coordination (or log it) only
// through [Coordination.Redacted] or its String and LogValue methods, which hide the URL's
// credentials.
type Coordination struct {
	// Redis is where the shared state lives: a redis://, rediss:// (TLS) or unix:// URL as
	// go-redis reads it, e.g. redis://:password@10.0.0.5:6379/0; a password's '@', ':', '/'
	// '?' or '#' is percent-encoded (as %40, %3A, %2F, %3F, %23), as in any URL. A URL with a
	// '#', or with an '@' after its host (where a password's '/' or '?' written as is puts the
	// rest of the password), is refused: an '@' in an option's value or a socket path is
	// written %40 too. Required unless the connector is given a client in code. Its shape and
	// the values of go-redis's client options (the query, such as dial_timeout=2s) are checked
	// here, and a misspelt option is named; an option go-redis's version reads that this one
	// does not know is left to the client, whose error names it. pgtraffic sets its own
	// dial_timeout, read_timeout and write_timeout (a quarter of sync_interval, at least 100ms,
	// within a sync's deadline, which is that, doubling after failed syncs, up to four times),
	// max_retries (none: the syncs retry on their own schedule) and pool_size: those options of
	// the URL are overridden. It never reaches an error, nor does an option's value;
	// in a log, a span or the status page its credentials are redacted. Its user needs the keys
	// and the channels under pgtraffic: (ACL ~pgtraffic:* and &pgtraffic:*); without the
	// channels, slots another instance holds as headroom move only at that instance's next sync.
	Redis string `yaml:"redis,omitempty" json:"redis,omitempty"`

	// SyncInterval is how often an instance syncs each shared budget's leases with Redis.
	// Zero means the default, 1s; otherwise between 100ms and 1m. A crashed instance's slots
	// return within three intervals.
	SyncInterval Duration `yaml:"sync_interval,omitempty" json:"sync_interval,omitempty"`

	// FallbackInstances is how many instances an instance assumes share each budget until it
	// has reached Redis once: it runs on the budget divided by this many. Zero means the
	// default, 10; afterwards the instances last seen are used.
	FallbackInstances int `yaml:"fallback_instances,omitempty" json:"fallback_instances,omitempty"`
}

// Redacted returns c.Redis with its credentials and query replaced by "xxxxx", for logs,
// errors and status pages: redis://xxxxx@10.0.0.5:6379/0.
func (c *Coordination) Redacted() string { return RedactURL(c.Redis) }

// String describes c with its URL redacted, so that %v never prints a password.
func (c Coordination) String() string {
	return "coordination{redis: " + c.Redacted() + ", sync_interval: " + c.SyncInterval.String() + "}"
}

// GoString is String, for %#v.
func (c Coordination) GoString() string { return c.String() }

// LogValue logs c with its URL redacted.
func (c Coordination) LogValue() slog.Value {
	return slog.GroupValue(slog.String("redis", c.Redacted()), slog.String("sync_interval", c.SyncInterval.String()))
}

// RedactURL returns a URL with any user information and query replaced by "xxxxx"; text that
// is not an absolute URL is replaced whole, as it may be nothing but a password, and so is a
// URL with an '@' after its host, whose host may be the first part of a password (see
// cutShort).
func RedactURL(raw string) string {
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" || u.Scheme == "" || cutShort(u) {
		return "xxxxx (not a URL)"
	}
	if u.User != nil {
		u.User = url.User("xxxxx")
	}
	if u.RawQuery != "" {
		u.RawQuery = "xxxxx"
	}
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}

// redisURLProblem returns what is wrong with a Redis URL, in words that never contain a
// credential or an option's value, or "". It checks the URL as go-redis reads it
// (redis.ParseURL): the scheme, the host and port, the database number, and the client options
// of its query (see queryProblem).
func redisURLProblem(raw string) string {
	if strings.ContainsRune(raw, '#') {
		// A URL ends at its '#': in a password written as is, the rest of the password would
		// be read as the fragment and its first part as the host, and go-redis would dial it.
		return "has a '#' (write one in a password as %23)"
	}
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" {
		return "not a URL"
	}
	if cutShort(u) {
		return "has an '@' after its host: a password's '/' or '?' ends the host (percent-encode the password: '/' as %2F, '?' as %3F, '@' as %40)"
	}
	switch u.Scheme {
	case "redis", "rediss":
		if u.Hostname() == "" {
			return "has no host"
		}
		if p := u.Port(); p != "" {
			if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
				return "has an invalid port"
			}
		}
		switch segs := strings.FieldsFunc(u.Path, func(r rune) bool { return r == '/' }); len(segs) {
		case 0:
		case 1:
			if !databaseNumber(segs[0]) {
				return "has an invalid database number (want /0, /1, ...)"
			}
		default:
			return "has a path of more than a database number"
		}
	case "unix":
		if strings.TrimSpace(u.Path) == "" {
			return "has no socket path"
		}
	default:
		return "must be a redis://, rediss:// or unix:// URL"
	}
	return queryProblem(u)
}

// cutShort reports whether u has an '@' after its host: in its path, query or fragment. A
// password's '/', '?' or '#' written as is ends the URL's authority, and the rest of the
// password, with the '@' and the host, is read as the path, query or fragment:
// redis://default:2024?Blue@h:6379/0 reads as host default, port 2024, and an option
// Blue@h:6379/0. Such a URL's host and options may be parts of a password. An '@' meant
// there is written %40 as well.
func cutShort(u *url.URL) bool {
	return strings.Contains(u.EscapedPath(), "@") || strings.Contains(u.RawQuery, "@") ||
		strings.Contains(u.EscapedFragment(), "@")
}

// optionKind is the kind of value a go-redis URL option takes.
type optionKind int

const (
	optInt      optionKind = iota
	optDatabase            // a database number, which the URL's path may give too
	optDuration
	optBool
	optString
)

// goRedisOptions are the client options go-redis v9 reads from a URL's query, by the kind of
// value each takes. go-redis refuses a URL whose option has a value of another kind, or an
// option it does not read, when the connector makes its client.
var goRedisOptions = map[string]optionKind{
	"db": optDatabase, "protocol": optInt, "client_name": optString, "max_retries": optInt,
	"min_retry_backoff": optDuration, "max_retry_backoff": optDuration, "dial_timeout": optDuration,
	"read_timeout": optDuration, "write_timeout": optDuration, "pool_fifo": optBool, "pool_size": optInt,
	"pool_timeout": optDuration, "min_idle_conns": optInt, "max_idle_conns": optInt,
	"max_active_conns": optInt, "max_concurrent_dials": optInt, "pipeline_pool_size": optInt,
	"pipeline_read_buffer_size": optInt, "pipeline_write_buffer_size": optInt,
	"conn_max_idle_time": optDuration, "idle_timeout": optDuration, "conn_max_lifetime": optDuration,
	"max_conn_age": optDuration, "conn_max_lifetime_jitter": optDuration, "skip_verify": optBool,
}

// goRedisAliases are options go-redis reads under an old name too, and refuses when a URL gives
// both names.
var goRedisAliases = map[string]string{"idle_timeout": "conn_max_idle_time", "max_conn_age": "conn_max_lifetime"}

// optionWants says what a value of each kind must look like, as go-redis reads it.
var optionWants = [...]string{
	optInt:      "an integer",
	optDatabase: "a number",
	optDuration: "a duration such as 2s, or a number of seconds",
	optBool:     "true, false, 1 or 0",
}

// queryProblem returns what is wrong with the client options of u's query, naming the option
// but never its value, or "": an option of goRedisOptions whose value (the last one given, as
// go-redis reads it) is not of its kind, or an option go-redis does not read that is one of
// them misspelt. An option that is neither is left to go-redis, whose version may read options
// that this one does not: the connector's error then names it.
func queryProblem(u *url.URL) string {
	q := u.Query()
	for _, name := range slices.Sorted(maps.Keys(q)) {
		kind, known := goRedisOptions[name]
		if !known {
			if s := suggest(name, slices.Sorted(maps.Keys(goRedisOptions))); s != "" {
				return fmt.Sprintf("has an option %s that go-redis does not read (did you mean %s?)", name, s)
			}
			continue
		}
		if alias, ok := goRedisAliases[name]; ok && q.Has(alias) {
			return fmt.Sprintf("has both %s and %s, one option under two names (give one)", alias, name)
		}
		if name == "skip_verify" && u.Scheme != "rediss" {
			return "has a skip_verify option, which only a rediss:// URL takes"
		}
		vs := q[name]
		if !optionValue(kind, vs[len(vs)-1]) {
			return fmt.Sprintf("has an invalid %s option (want %s)", name, optionWants[kind])
		}
	}
	return ""
}

// optionValue reports whether go-redis reads v as a value of kind; an empty value is the
// option's default.
func optionValue(kind optionKind, v string) bool {
	if v == "" {
		return true
	}
	switch kind {
	case optInt:
		_, err := strconv.Atoi(v)
		return err == nil
	case optDatabase:
		return databaseNumber(v)
	case optDuration:
		if _, err := strconv.Atoi(v); err == nil {
			return true
		}
		_, err := time.ParseDuration(v)
		return err == nil
	case optBool:
		return v == "true" || v == "false" || v == "1" || v == "0"
	}
	return true
}

// databaseNumber reports whether s is a Redis database number.
func databaseNumber(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= 0
}

// validateCoordination checks the coordination section and the budgets' shared flags.
func (c *Config) validateCoordination(p *problems) {
	if co := c.Coordination; co != nil {
		at := field{}.member(c, &c.Coordination)
		if co.Redis != "" {
			if problem := redisURLProblem(co.Redis); problem != "" {
				p.add(at.member(co, &co.Redis), "%s (the value is not shown: it may hold a password)", problem)
			}
		}
		p.durationField(at, co, &co.SyncInterval, true)
		if d := time.Duration(co.SyncInterval); d != 0 && (d < MinSyncInterval || d > MaxSyncInterval) {
			p.add(at.member(co, &co.SyncInterval), "must be between %v and %v, got %v", MinSyncInterval, MaxSyncInterval, co.SyncInterval)
		}
		if co.FallbackInstances < 0 || co.FallbackInstances == 0 && p.explicit(at, co, &co.FallbackInstances) {
			p.add(at.member(co, &co.FallbackInstances), "must be > 0 (omit it for the default), got %d", co.FallbackInstances)
		}
	}
	for i := range c.Budgets {
		if b := &c.Budgets[i]; b.Shared != nil && *b.Shared && c.Coordination == nil {
			p.add(field{}.member(c, &c.Budgets).index(i).member(b, &b.Shared), "needs a coordination section (where the instances share it)")
		}
	}
}

// IsShared reports whether budget b of c is shared across instances: when c has a
// coordination section and b does not say shared: false.
func (c *Config) IsShared(b *Budget) bool {
	return c.Coordination != nil && (b.Shared == nil || *b.Shared)
}

// cloneCoordination deep-copies the coordination parts of c into out, a shallow copy.
func cloneCoordination(out, c *Config) {
	if c.Coordination != nil {
		co := *c.Coordination
		out.Coordination = &co
	}
	for i := range out.Budgets {
		if s := out.Budgets[i].Shared; s != nil {
			v := *s
			out.Budgets[i].Shared = &v
		}
	}
}

// coordinationDefaults makes the coordination section's defaults explicit: sync_interval 1s
// and fallback_instances 10. (A budget's shared follows from the section: see
// [Config.fillDependentDefaults].)
func (c *Config) coordinationDefaults() {
	if c.Coordination == nil {
		return
	}
	if c.Coordination.SyncInterval == 0 {
		c.Coordination.SyncInterval = Duration(DefaultSyncInterval)
	}
	if c.Coordination.FallbackInstances == 0 {
		c.Coordination.FallbackInstances = DefaultFallbackInstances
	}
}

// DefaultFallbackInstances is the default of [Coordination.FallbackInstances]: how many
// instances a budget is assumed to be shared by before an instance has ever reached Redis.
// Assuming one would hand each instance the whole budget; ten is the low end of the
// deployments shared budgets are for, and errs towards admitting too little for the few
// seconds until Redis answers.
const DefaultFallbackInstances = 10
