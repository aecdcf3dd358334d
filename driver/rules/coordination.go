package rules

import (
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Limits of [Coordination.SyncInterval].
const (
	// MinSyncInterval keeps Redis load bounded: each instance makes one call per shared
	// budget per interval, and a sync's deadline is a quarter of it.
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
	// '?' or '#' is percent-encoded (a '#' as %23), as in any URL. Required unless the connector
	// is given a client in code. Its shape is checked here, its client options (the query) when
	// the client is made. It never reaches an error; in a log, a span or the status page its
	// credentials are redacted. Its user needs the keys and the channels under pgtraffic:
	// (ACL ~pgtraffic:* and &pgtraffic:*); without the channels, slots another instance holds
	// as headroom move only at that instance's next sync.
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
// is not an absolute URL is replaced whole, as it may be nothing but a password.
func RedactURL(raw string) string {
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" || u.Scheme == "" {
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

// redisURLProblem returns what is wrong with a Redis URL, in words that never contain any
// part of it, or "". It checks the URL's shape as go-redis reads it (redis.ParseURL): the
// scheme, the host and port, the database number; the client options of its query are left to
// go-redis, which internal/coord calls when it makes the client.
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
	if db := u.Query()["db"]; len(db) > 0 && !databaseNumber(db[len(db)-1]) {
		return "has an invalid db option (want a number)"
	}
	return ""
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
