package engine

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/pattern"
	"github.com/pgtraffic/pgtraffic/internal/ruleset"
)

// Guard names, as reported in BlockedError.Budget and .Rule.
const (
	GuardRequireWhere  = "require_where"
	GuardBlockTruncate = "block_truncate"
)

type mode uint8

const (
	modeWarn mode = iota // the default
	modeEnforce
	modeOff
)

func parseMode(m rules.Mode) mode {
	switch m {
	case rules.ModeEnforce:
		return modeEnforce
	case rules.ModeOff:
		return modeOff
	}
	return modeWarn
}

var modeNames = [...]string{
	modeWarn:    string(rules.ModeWarn),
	modeEnforce: string(rules.ModeEnforce),
	modeOff:     string(rules.ModeOff),
}

func (m mode) String() string { return modeNames[m] }

// explainMode orders the explain modes by eagerness; the most eager of a statement's budgets wins.
type explainMode uint8

const (
	explainAuto explainMode = iota
	explainPattern
	explainCall
)

func parseExplain(s string) explainMode {
	switch s {
	case rules.ExplainPattern:
		return explainPattern
	case rules.ExplainCall:
		return explainCall
	}
	return explainAuto
}

// compiled is one immutable version of the rules, swapped atomically on reload.
type compiled struct {
	// gen numbers the versions, so that what is saved per statement text names its version
	// without keeping an old one alive (texts.go).
	gen            uint64
	empty          bool // no rules and no guards: the fast path
	rules          *ruleset.Set
	ruleBudget     []int    // rule index -> budget index
	ruleName       []string // rule index -> "app=reporting,controller=export"
	budgets        []*budgetState
	guards         []guardState
	healthInterval time.Duration
	expiry         // the rules' until times (until.go)
}

type budgetState struct {
	name     string
	mode     mode
	b        *budget.Budget
	per      string
	needCost bool
	explain  explainMode
	maxWait  time.Duration
	throttle map[string]float64
	// closed, when set, is the zero limit that refuses every statement (limits.go).
	closed *Denial
	// maxDuration bounds an admitted statement's run (overrun.go); 0: none.
	maxDuration time.Duration
	// quarantine, when set, refuses the patterns that keep overrunning (quarantine.go), whose
	// overruns of perQuery (per_query_limit, 0: none) or maxDuration it counts.
	quarantine *rules.Quarantine
	perQuery   time.Duration
}

type guardState struct {
	name  string
	mode  mode
	scope *ruleset.Set // nil: every statement; else one rule, the guard's match (CIDR values work)
	limit string
}

func (g *guardState) applies(p *pattern.Pattern) bool {
	if g.name == GuardBlockTruncate {
		return p.Truncate
	}
	return p.UnsafeWrite
}

// matches reports whether the statement's tags satisfy the guard's scope (an empty scope matches all).
func (g *guardState) matches(tags []ruleset.KV) bool {
	if g.scope == nil {
		return true
	}
	var buf [1]int
	return len(g.scope.Match(tags, buf[:0])) > 0
}

// compile builds the immutable state of cfg. e.life.mu must be held (it updates
// e.life.budgets).
func (e *Engine) compile(cfg *rules.Config) (*compiled, error) {
	cores := serverCores(cfg)
	e.life.gen++
	c := &compiled{gen: e.life.gen, healthInterval: time.Duration(cfg.HealthInterval)}
	if c.healthInterval <= 0 {
		c.healthInterval = rules.DefaultHealthInterval
	}
	// Sized up front: a config may hold a budget per tenant.
	index := make(map[string]int, len(cfg.Budgets))
	keep := make(map[string]*budget.Budget, len(cfg.Budgets))
	c.budgets = make([]*budgetState, 0, len(cfg.Budgets))
	for i, b := range cfg.Budgets {
		spec := budget.Spec{
			MaxConcurrent:    deref(b.MaxConcurrent),
			PerQueryLimit:    time.Duration(b.PerQueryLimit).Seconds(),
			Rate:             deref(b.ServerShare) * cores,
			Burst:            time.Duration(b.BurstLimit).Seconds(),
			WarningThreshold: b.WarningThreshold,
			MaxKeys:          e.maxKeys,
		}
		// Statements wait only under max_wait, at most max_queue of them per value.
		maxWait := time.Duration(b.MaxWait)
		if maxWait > 0 {
			spec.MaxQueue = b.QueueBound()
		}
		if spec.MaxQueue == 0 {
			maxWait = 0 // max_queue: 0 lets none wait
		}
		bb, ok := e.life.budgets[b.Name]
		if ok {
			bb.SetSpec(e.now(), spec)
		} else {
			bb = budget.New(spec)
		}
		keep[b.Name] = bb
		index[b.Name] = i
		c.budgets = append(c.budgets, &budgetState{
			name:        b.Name,
			mode:        parseMode(b.Mode),
			b:           bb,
			per:         b.Per,
			needCost:    spec.PerQueryLimit > 0 || spec.Rate > 0,
			explain:     parseExplain(b.Explain),
			maxWait:     maxWait,
			throttle:    b.ThrottleWhen,
			closed:      closedBy(&b),
			maxDuration: time.Duration(b.MaxDuration),
			quarantine:  b.Quarantine,
			perQuery:    time.Duration(b.PerQueryLimit),
		})
	}
	if len(cfg.Rules) > 0 {
		set, err := ruleset.Compile(cfg.Rules, func(name string) int {
			if i, ok := index[name]; ok {
				return i
			}
			return -1
		})
		if err != nil {
			return nil, err
		}
		c.rules = set
		c.ruleBudget = make([]int, 0, len(cfg.Rules))
		c.ruleName = make([]string, 0, len(cfg.Rules))
		for _, r := range cfg.Rules {
			c.ruleBudget = append(c.ruleBudget, index[r.Budget])
			c.ruleName = append(c.ruleName, r.String())
		}
		c.compileExpiry(cfg.Rules)
	}
	for _, g := range []struct {
		name string
		g    rules.Guard
		what string
	}{
		{GuardRequireWhere, cfg.Guards.RequireWhere, "UPDATE or DELETE without a WHERE that restricts rows"},
		{GuardBlockTruncate, cfg.Guards.BlockTruncate, "TRUNCATE"},
	} {
		if g.g.Mode == "" || parseMode(g.g.Mode) == modeOff {
			continue // guards default to off, unlike budgets
		}
		gs := guardState{name: g.name, mode: parseMode(g.g.Mode), limit: g.what}
		if len(g.g.Match) > 0 {
			scope, err := ruleset.Compile([]rules.Rule{{Match: g.g.Match}}, nil)
			if err != nil {
				return nil, err
			}
			gs.scope = scope
		}
		c.guards = append(c.guards, gs)
	}
	c.empty = c.rules == nil && len(c.guards) == 0
	// A removed budget whose statements still hold slots, or whose debt has not drained, stays
	// in e.life.budgets (not in force) so that a later reload re-adding it finds its state; its
	// statements release into it meanwhile. A reload that finds it idle forgets it.
	now := e.now()
	for name, bb := range e.life.budgets {
		if _, ok := keep[name]; !ok {
			if s := bb.Snapshot(now); s.InFlight > 0 || s.Debt > 0 {
				keep[name] = bb
			}
		}
	}
	e.life.budgets = keep
	e.quarantined.configure(cfg.Budgets)
	return c, nil
}

// serverCores is cfg's server_cores, or its default when cfg leaves it out: a Config built in
// code is validated but not given its defaults.
func serverCores(cfg *rules.Config) float64 {
	if cfg.ServerCores > 0 {
		return cfg.ServerCores
	}
	return rules.DefaultServerCores
}

// healthMetrics lists the sampled metrics the budgets use (in_flight is local, not sampled).
func healthMetrics(cfg *rules.Config) []string {
	var out []string
	for _, b := range cfg.Budgets {
		if parseMode(b.Mode) == modeOff {
			continue
		}
		for k := range b.ThrottleWhen {
			if k != rules.MetricInFlight && !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	sort.Strings(out)
	return out
}

func formatThreshold(metric string, value, threshold float64) string {
	if metric == rules.MetricReplicationLag {
		return fmt.Sprintf("%s=%s, threshold %s", metric,
			time.Duration(value*float64(time.Second)).Round(time.Millisecond),
			time.Duration(threshold*float64(time.Second)).Round(time.Millisecond))
	}
	return fmt.Sprintf("%s=%g, threshold %g", metric, value, threshold)
}
