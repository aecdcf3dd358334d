package rules

import (
	"maps"
	"math"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// minHealthInterval keeps a typo (1us) from turning the sampler into a load generator.
const minHealthInterval = 10 * time.Millisecond

// Validate checks c as [Parse] checks a file — unknown budget names, bad modes, bad CIDRs,
// out-of-range numbers and so on — and returns every problem found, joined, each an [*Error]
// naming the field path. In c a zero field means omitted. Validate does not modify c; see
// [Config.WithDefaults] for the values the omitted fields take.
func (c *Config) Validate() error {
	var p problems
	c.validate(&p)
	return p.err()
}

// validate adds c's problems to p. p.lines, when set, tells which fields a file wrote
// explicitly, and where.
func (c *Config) validate(p *problems) {
	if !finite(c.ServerCores) || c.ServerCores < 0 || c.ServerCores == 0 && p.explicit("server_cores") {
		p.add("server_cores", "must be a number > 0, got %v", c.ServerCores)
	}
	p.durationField("", "health_interval", c.HealthInterval, true)
	if c.HealthInterval > 0 && time.Duration(c.HealthInterval) < minHealthInterval {
		p.add("health_interval", "must be at least %v, got %v", minHealthInterval, c.HealthInterval)
	}
	for _, name := range slices.Sorted(maps.Keys(c.HealthQueries)) {
		path := keyPath("health_queries", name)
		if !validMetricName(name) {
			p.add(path, "a health query name needs letters, digits, '_' or '-' only")
		}
		if strings.TrimSpace(c.HealthQueries[name]) == "" {
			p.add(path, "empty query")
		}
	}

	cores := c.ServerCores
	if cores <= 0 || !finite(cores) {
		cores = DefaultServerCores
	}
	// first indexes the budgets by name (the first of each name), so that checking a rule's
	// budget is a map probe: a config may hold a budget per tenant, tens of thousands of them.
	first := make(map[string]int, len(c.Budgets))
	for i := range c.Budgets {
		c.validateBudget(p, i, cores, first)
	}

	for i := range c.Rules {
		r := &c.Rules[i]
		_, known := first[r.Budget]
		if r.Budget != "" && known && len(r.Match) > 0 && validMatch(r.Match) {
			continue // the common case, checked without building a path
		}
		path := indexPath("rules", i)
		switch {
		case r.Budget == "":
			p.add(path+".budget", "required")
		case !known:
			p.add(path+".budget", "unknown budget %s", quoteShort(r.Budget))
		}
		if len(r.Match) == 0 {
			p.add(path+".match", "required: a rule must match at least one tag")
		}
		validateMatch(p, path+".match", r.Match)
	}

	for _, g := range []struct {
		path  string
		guard *Guard
	}{
		{"guards.require_where", &c.Guards.RequireWhere},
		{"guards.block_truncate", &c.Guards.BlockTruncate},
	} {
		if !g.guard.Mode.valid() {
			p.add(g.path+".mode", "unknown mode %s (want enforce, warn or off)", quoteShort(string(g.guard.Mode)))
		}
		if g.guard.Mode == "" && len(g.guard.Match) > 0 {
			p.add(g.path+".mode", "required with match (a guard without a mode is off)")
		}
		validateMatch(p, g.path+".match", g.guard.Match)
	}
	c.validateCoordination(p)
}

// validateBudget checks budget i and adds its name to first. Field paths are built only for
// a problem or to ask whether a zero was written: a config may hold many budgets.
func (c *Config) validateBudget(p *problems, i int, cores float64, first map[string]int) {
	b := &c.Budgets[i]
	path := indexPath("budgets", i)
	j, dup := first[b.Name]
	if !dup {
		first[b.Name] = i
	}
	switch {
	case b.Name == "":
		p.add(path+".name", "required")
	case strings.TrimSpace(b.Name) != b.Name || strings.IndexFunc(b.Name, unicode.IsControl) >= 0:
		p.add(path+".name", "leading or trailing spaces or control characters in %s", quoteShort(b.Name))
	case dup:
		p.add(path+".name", "duplicate budget name %s (also budgets[%d])", quoteShort(b.Name), j)
	}
	if !b.Mode.valid() {
		p.add(path+".mode", "unknown mode %s (want enforce, warn or off)", quoteShort(string(b.Mode)))
	}
	if m := b.MaxConcurrent; m != nil && *m < 0 {
		p.add(path+".max_concurrent", "must be >= 0 (0 admits nothing; omit it for no limit), got %d", *m)
	}
	p.durationField(path, "per_query_limit", b.PerQueryLimit, true)
	share := 0.0
	if b.ServerShare != nil {
		share = *b.ServerShare
		if !finite(share) || share < 0 || share > 1 {
			p.add(path+".server_share", "must be in [0, 1], got %v", share)
		}
	}
	p.durationField(path, "burst_limit", b.BurstLimit, true)
	if b.BurstLimit > 0 && !(share > 0) {
		p.add(path+".burst_limit", "needs server_share (the rate the bucket drains at)")
	}
	if share > 0 && share <= 1 && b.BurstLimit == 0 && share*cores*float64(vocab.DefaultBurstWindow) > math.MaxInt64 {
		p.add(path+".server_share", "server_share × server_cores is too large for a default burst_limit")
	}
	p.durationField(path, "max_duration", b.MaxDuration, true)
	if q := b.Quarantine; q != nil {
		if q.After < 1 {
			p.add(path+".quarantine.after", "must be at least 1, got %d", q.After)
		}
		if q.For <= 0 {
			p.add(path+".quarantine.for", "must be a duration > 0, got %v", q.For)
		}
		if b.MaxDuration <= 0 && b.PerQueryLimit <= 0 {
			p.add(path+".quarantine", "needs max_duration or per_query_limit (the overruns it counts)")
		}
	}
	if !finite(b.WarningThreshold) || b.WarningThreshold < 0 || b.WarningThreshold >= 1 ||
		b.WarningThreshold == 0 && p.explicit(path+".warning_threshold") {
		p.add(path+".warning_threshold", "must be in (0, 1), got %v", b.WarningThreshold)
	}
	if b.Per == "" && p.explicit(path+".per") || b.Per != "" && strings.TrimSpace(b.Per) != b.Per {
		p.add(path+".per", "must be a tag key, got %s", quoteShort(b.Per))
	}
	p.durationField(path, "max_wait", b.MaxWait, false)
	if q := b.MaxQueue; q != nil {
		if *q < 0 {
			p.add(path+".max_queue", "must be >= 0, got %d", *q)
		}
		if b.MaxWait == 0 {
			p.add(path+".max_queue", "has no effect without max_wait (only statements that may wait are queued)")
		}
	}
	// Sorted for the order of messages; most budgets have no throttle_when, and sorting
	// allocates even for none.
	if len(b.ThrottleWhen) > 0 {
		for _, key := range slices.Sorted(maps.Keys(b.ThrottleWhen)) {
			kp := keyPath(path+".throttle_when", key)
			switch name, custom := strings.CutPrefix(key, CustomMetricPrefix); {
			case key == MetricActiveQueries || key == MetricReplicationLag || key == MetricInFlight:
			case custom:
				if _, ok := c.HealthQueries[name]; !ok {
					p.add(kp, "no health query named %s in health_queries", quoteShort(name))
				}
			default:
				p.add(kp, "unknown metric (want active_queries, replication_lag, in_flight or custom.<name>)")
			}
			if v := b.ThrottleWhen[key]; !finite(v) || v < 0 {
				p.add(kp, "must be a number >= 0, got %v", v)
			}
		}
	}
	switch b.Explain {
	case "", ExplainAuto, ExplainPattern, ExplainCall:
	default:
		p.add(path+".explain", "unknown value %s (want auto, pattern or call)", quoteShort(b.Explain))
	}
}

// durationField checks that field d of parent (a path, "" for the top level) is not negative
// and, when zero would read as "no limit" but was written explicitly (positive), not zero
// either.
func (p *problems) durationField(parent, field string, d Duration, positive bool) {
	if d > 0 || d == 0 && (!positive || p.root == nil) {
		return // the common case, checked without building a path
	}
	path := field
	if parent != "" {
		path = parent + "." + field
	}
	switch {
	case d < 0:
		p.add(path, "must not be negative, got %v", d)
	case d == 0 && p.explicit(path):
		p.add(path, "must be > 0 (omit it for the default), got 0")
	}
}

func validateMatch(p *problems, path string, m map[string]string) {
	if validMatch(m) {
		return // the common case, checked without sorting: a file may hold many rules
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		kp := keyPath(path, k)
		if k == "" {
			p.add(kp, "empty tag key")
		}
		if _, _, err := ParseMatchValue(m[k]); err != nil {
			p.add(kp, "%v", err)
		}
	}
}

// validMatch reports whether a match has no problem for validateMatch to report.
func validMatch(m map[string]string) bool {
	for k, v := range m {
		if _, _, err := ParseMatchValue(v); k == "" || err != nil {
			return false
		}
	}
	return true
}

func validMetricName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }
