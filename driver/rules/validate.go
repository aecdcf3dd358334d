package rules

import (
	"maps"
	"math"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"go.yaml.in/yaml/v3"
)

// minHealthInterval keeps a typo (1us) from turning the sampler into a load generator;
// vocab.MaxHealthInterval bounds one of the other kind.
const minHealthInterval = 10 * time.Millisecond

// Health queries are each read every health_interval and, with a coordination section,
// published through Redis in one sample: their number and names are bounded, well within
// what the instances reading a sample accept from Redis.
const (
	maxHealthQueries = 64
	maxMetricName    = 128
)

// Validate checks c as [Parse] checks a file — unknown budget names, bad modes, bad CIDRs,
// out-of-range numbers and so on — and returns every problem found, joined, each an [*Error]
// naming the field path. In c a zero field means omitted. Validate does not modify c; see
// [Config.WithDefaults] for the values the omitted fields take.
func (c *Config) Validate() error {
	var p problems
	c.validate(&p)
	return p.err()
}

// validate adds c's problems to p. p.root, when set, is the parsed file: it tells which
// fields were written explicitly, and where.
func (c *Config) validate(p *problems) {
	top := field{}
	if !finite(c.ServerCores) || c.ServerCores < 0 || c.ServerCores == 0 && p.explicit(top, c, &c.ServerCores) {
		p.add(top.member(c, &c.ServerCores), "must be a number > 0, got %v", c.ServerCores)
	}
	p.durationField(top, c, &c.HealthInterval, true)
	if c.HealthInterval > 0 && time.Duration(c.HealthInterval) < minHealthInterval {
		p.add(top.member(c, &c.HealthInterval), "must be at least %v, got %v", minHealthInterval, c.HealthInterval)
	}
	if time.Duration(c.HealthInterval) > vocab.MaxHealthInterval {
		p.add(top.member(c, &c.HealthInterval), "must be at most %v, got %v", vocab.MaxHealthInterval, c.HealthInterval)
	}
	if n := len(c.HealthQueries); n > maxHealthQueries {
		p.add(top.member(c, &c.HealthQueries), "at most %d health queries, got %d", maxHealthQueries, n)
	}
	for _, name := range slices.Sorted(maps.Keys(c.HealthQueries)) {
		at := top.member(c, &c.HealthQueries).key(name)
		if !validMetricName(name) {
			p.add(at, "a health query name needs letters, digits, '_' or '-' only")
		} else if len(name) > maxMetricName {
			p.add(at, "a health query name of at most %d characters, got %d", maxMetricName, len(name))
		}
		if strings.TrimSpace(c.HealthQueries[name]) == "" {
			p.add(at, "empty query")
		}
	}

	cores := c.ServerCores
	if cores <= 0 || !finite(cores) {
		cores = DefaultServerCores
	}
	// first indexes the budgets by name (the first of each name), so that checking a rule's
	// budget is a map probe: a config may hold a budget per tenant, tens of thousands of them.
	first := make(map[string]int, len(c.Budgets))
	budgets := top.member(c, &c.Budgets)
	for i := range c.Budgets {
		c.validateBudget(p, budgets.index(i), i, cores, first)
	}
	for i := range c.Rules {
		c.validateRule(p, i, first)
	}
	c.Guards.validate(p, top.member(c, &c.Guards))
	c.validateCoordination(p)
}

// validateRule checks rule i against the budgets indexed in first.
func (c *Config) validateRule(p *problems, i int, first map[string]int) {
	r := &c.Rules[i]
	_, known := first[r.Budget]
	if r.Budget != "" && known && len(r.Match) > 0 && validMatch(r.Match) {
		return // the common case, checked without building a field
	}
	at := field{}.member(c, &c.Rules).index(i)
	switch {
	case r.Budget == "":
		p.add(at.member(r, &r.Budget), "required")
	case !known:
		p.add(at.member(r, &r.Budget), "unknown budget %s", quoteShort(r.Budget))
	}
	if len(r.Match) == 0 {
		p.add(at.member(r, &r.Match), "required: a rule must match at least one tag")
	}
	validateMatch(p, at.member(r, &r.Match), r.Match)
}

func (gs *Guards) validate(p *problems, at field) {
	for _, g := range []*Guard{&gs.RequireWhere, &gs.BlockTruncate} {
		at := at.member(gs, g)
		mode := at.member(g, &g.Mode)
		writtenEmpty := false
		if n := p.written(at); g.Mode == "" && n != nil {
			// In the short form (require_where: enforce) the guard is written as its mode alone.
			writtenEmpty = n.Kind == yaml.ScalarNode || p.written(mode) != nil
		}
		switch {
		case !g.Mode.valid() || writtenEmpty:
			p.mode(mode, g.Mode, writtenEmpty)
		case g.Mode == "" && len(g.Match) > 0:
			p.add(mode, "required with match (a guard without a mode is off)")
		}
		validateMatch(p, at.member(g, &g.Match), g.Match)
	}
}

// The values a message lists as the ones allowed.
var (
	modeChoices    = orList(string(ModeEnforce), string(ModeWarn), string(ModeOff))
	explainChoices = orList(ExplainAuto, ExplainPattern, ExplainCall)
	metricChoices  = orList(MetricActiveQueries, MetricReplicationLag, MetricInFlight, CustomMetricPrefix+"<name>")
)

// orList lists words as a message does: "a, b or c".
func orList(words ...string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// mode checks a budget's or guard's mode, at at. writtenEmpty says that the file wrote it as "",
// which would read as the default (warn, or off for a guard): it is refused, as it is more
// likely a template's unset variable than a choice, and an enforce meant so would be lost
// without a word. A mode left out (or written with no value) is the default.
func (p *problems) mode(at field, m Mode, writtenEmpty bool) {
	switch {
	case !m.valid():
		p.add(at, "unknown mode %s (want %s)", quoteShort(string(m)), modeChoices)
	case writtenEmpty:
		p.add(at, "must be %s (leave it out for the default), got \"\"", modeChoices)
	}
}

// validateBudget checks budget i, which is at at, and adds its name to first. Its fields are
// named only for a problem or to ask whether a zero was written: a config may hold many budgets.
func (c *Config) validateBudget(p *problems, at field, i int, cores float64, first map[string]int) {
	b := &c.Budgets[i]
	b.validateName(p, at, i, first)
	if b.Mode == "" || !b.Mode.valid() {
		p.mode(at.member(b, &b.Mode), b.Mode, b.Mode == "" && p.explicit(at, b, &b.Mode))
	}
	b.validateLimits(p, at, cores)
	b.validateOverruns(p, at)
	if !finite(b.WarningThreshold) || b.WarningThreshold < 0 || b.WarningThreshold >= 1 ||
		b.WarningThreshold == 0 && p.explicit(at, b, &b.WarningThreshold) {
		p.add(at.member(b, &b.WarningThreshold), "must be in (0, 1), got %v", b.WarningThreshold)
	}
	if b.Per == "" && p.explicit(at, b, &b.Per) || b.Per != "" && strings.TrimSpace(b.Per) != b.Per {
		p.add(at.member(b, &b.Per), "must be a tag key, got %s", quoteShort(b.Per))
	}
	b.validateWaiting(p, at)
	// Most budgets have no throttle_when, and sorting allocates even for none.
	if len(b.ThrottleWhen) > 0 {
		c.validateThrottle(p, b, at.member(b, &b.ThrottleWhen))
	}
	switch b.Explain {
	case "":
		if p.explicit(at, b, &b.Explain) { // as an empty mode is
			p.add(at.member(b, &b.Explain), "must be %s (leave it out for the default), got \"\"", explainChoices)
		}
	case ExplainAuto, ExplainPattern, ExplainCall:
	default:
		p.add(at.member(b, &b.Explain), "unknown value %s (want %s)", quoteShort(b.Explain), explainChoices)
	}
}

// validateName checks the name of b, budget i at at, and adds it to first. A guard's name is
// taken: the metrics, the log and the status name a guard's decisions by it, as a budget's.
func (b *Budget) validateName(p *problems, at field, i int, first map[string]int) {
	j, dup := first[b.Name]
	if !dup {
		first[b.Name] = i
	}
	switch {
	case b.Name == "":
		p.add(at.member(b, &b.Name), "required")
	case strings.TrimSpace(b.Name) != b.Name || strings.IndexFunc(b.Name, unicode.IsControl) >= 0:
		p.add(at.member(b, &b.Name), "leading or trailing spaces or control characters in %s", quoteShort(b.Name))
	case dup:
		p.add(at.member(b, &b.Name), "duplicate budget name %s (also budgets[%d])", quoteShort(b.Name), j)
	case b.Name == vocab.GuardRequireWhere || b.Name == vocab.GuardBlockTruncate:
		p.add(at.member(b, &b.Name), "%s is a guard's name, which its decisions are counted and logged by", quoteShort(b.Name))
	}
}

// validateLimits checks the limits a budget admits a statement by: its concurrency, the cost
// of one statement and its bucket.
func (b *Budget) validateLimits(p *problems, at field, cores float64) {
	if m := b.MaxConcurrent; m != nil && *m < 0 {
		p.add(at.member(b, &b.MaxConcurrent), "must be >= 0 (0 admits nothing; omit it for no limit), got %d", *m)
	}
	p.durationField(at, b, &b.PerQueryLimit, true)
	share := 0.0
	if b.ServerShare != nil {
		share = *b.ServerShare
		if !finite(share) || share < 0 || share > 1 {
			p.add(at.member(b, &b.ServerShare), "must be in [0, 1], got %v", share)
		}
	}
	p.durationField(at, b, &b.BurstLimit, true)
	if b.BurstLimit > 0 && !(share > 0) {
		p.add(at.member(b, &b.BurstLimit), "needs server_share (the rate the bucket drains at)")
	}
	if share > 0 && share <= 1 && b.BurstLimit == 0 && share*cores*float64(vocab.DefaultBurstWindow) > math.MaxInt64 {
		p.add(at.member(b, &b.ServerShare), "server_share × server_cores is too large for a default burst_limit")
	}
}

// validateOverruns checks max_duration and the quarantine that counts its overruns.
func (b *Budget) validateOverruns(p *problems, at field) {
	p.durationField(at, b, &b.MaxDuration, true)
	q := b.Quarantine
	if q == nil {
		return
	}
	qf := at.member(b, &b.Quarantine)
	if q.After < 1 {
		p.add(qf.member(q, &q.After), "must be at least 1, got %d", q.After)
	}
	if q.For <= 0 {
		p.add(qf.member(q, &q.For), "must be a duration > 0, got %v", q.For)
	}
	if b.MaxDuration <= 0 && b.PerQueryLimit <= 0 {
		p.add(qf, "needs max_duration or per_query_limit (the overruns it counts)")
	}
}

// validateWaiting checks max_wait and the queue of the statements waiting under it.
func (b *Budget) validateWaiting(p *problems, at field) {
	p.durationField(at, b, &b.MaxWait, false)
	q := b.MaxQueue
	if q == nil {
		return
	}
	if *q < 0 {
		p.add(at.member(b, &b.MaxQueue), "must be >= 0, got %d", *q)
	}
	if b.MaxWait == 0 {
		p.add(at.member(b, &b.MaxQueue), "has no effect without max_wait (only statements that may wait are queued)")
	}
}

// validateThrottle checks budget b's throttle_when, at at, against c's health queries.
func (c *Config) validateThrottle(p *problems, b *Budget, at field) {
	for _, key := range slices.Sorted(maps.Keys(b.ThrottleWhen)) {
		kf := at.key(key)
		switch name, custom := strings.CutPrefix(key, CustomMetricPrefix); {
		case key == MetricActiveQueries || key == MetricReplicationLag || key == MetricInFlight:
		case custom:
			if _, ok := c.HealthQueries[name]; !ok {
				p.add(kf, "no health query named %s in health_queries", quoteShort(name))
			}
		default:
			p.add(kf, "unknown metric (want %s)", metricChoices)
		}
		if v := b.ThrottleWhen[key]; !finite(v) || v < 0 {
			p.add(kf, "must be a number >= 0, got %v", v)
		}
	}
}

// durationField checks that the duration field of struct *s at address d, which is at at, is not
// negative and, when zero would read as "no limit" but was written explicitly (positive), not
// zero either. The field is named only for a problem, or to ask whether a zero was written.
func (p *problems) durationField(at field, s any, d *Duration, positive bool) {
	switch {
	case *d > 0 || *d == 0 && (!positive || p.root == nil):
		// the common case
	case *d < 0:
		p.add(at.member(s, d), "must not be negative, got %v", *d)
	case p.explicit(at, s, d):
		p.add(at.member(s, d), "must be > 0 (omit it for the default), got 0")
	}
}

func validateMatch(p *problems, at field, m map[string]string) {
	if validMatch(m) {
		return // the common case, checked without sorting: a file may hold many rules
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		kp := at.key(k)
		if k == "" {
			p.add(kp, "empty tag key")
		}
		if _, _, err := ParseMatchValue(m[k]); err != nil {
			p.add(kp, "%v", err)
		}
		if _, err := ExactMatchValue(k, m[k]); err != nil {
			p.add(kp, "%v", err)
		}
		if !validKind(k, m[k]) {
			p.add(kp, "unknown statement kind %s: it would match no statement (want one of %s)", quoteShort(m[k]),
				strings.Join(vocab.Kinds(), ", "))
		}
	}
}

// validMatch reports whether a match has no problem for validateMatch to report.
func validMatch(m map[string]string) bool {
	for k, v := range m {
		if _, _, err := ParseMatchValue(v); k == "" || err != nil || !validKind(k, v) {
			return false
		}
		if _, err := ExactMatchValue(k, v); err != nil {
			return false
		}
	}
	return true
}

// validKind reports whether v, the value a match gives tag k, may match: the built-in statement
// tag takes only the statement kinds (lowercase), so that {statement: DELETE} is refused rather
// than accepted and matching nothing.
func validKind(k, v string) bool {
	return k != vocab.KeyStatement || slices.Contains(vocab.Kinds(), v)
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
