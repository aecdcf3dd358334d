package engine

import (
	"fmt"
	"sync"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/pattern"
	"github.com/pgtraffic/pgtraffic/internal/ruleset"
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
// auto explains all that pattern does, and each call of a volatile pattern besides.
type explainMode uint8

const (
	explainPattern explainMode = iota
	explainAuto
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
	// queueFull is the limit of a statement refused because the budget's queue is full
	// (max_queue=N; admission.go).
	queueFull string
	throttle  map[string]float64
	// closed, when set, is the zero limit that refuses every statement (limits.go).
	closed *Denial
	// maxDuration bounds an admitted statement's run (overrun.go); 0: none. overrun is the
	// cause of the context of a statement it bounds.
	maxDuration time.Duration
	overrun     error
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
	if g.name == vocab.GuardBlockTruncate {
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

// Rules is a compiled rule set, ready for [Engine.Install]: one immutable version of a
// Config, with what installing it changes in the budgets it keeps.
type Rules struct {
	c      *compiled
	base   uint64           // the registry's version the budgets were resolved against
	byName map[string]named // the budgets by name
	quar   []rules.Budget   // the budgets' quarantine settings, for the quarantine table
}

// named is one budget of a Rules: its state, and the limits it takes at Install.
type named struct {
	b    *budget.Budget
	spec budget.Spec
}

// Gen orders compiled rule sets: a later Compile has a greater Gen.
func (r *Rules) Gen() uint64 { return r.c.gen }

// Budget returns the budget named name of r and its limits; nil if r has none. It is the one
// in force when r keeps it, so that its state (debt, statements in flight) carries over.
func (r *Rules) Budget(name string) (*budget.Budget, budget.Spec) {
	n := r.byName[name]
	return n.b, n.spec
}

// HealthInterval is r's health_interval, its default when the Config leaves it out.
func (r *Rules) HealthInterval() time.Duration { return r.c.healthInterval }

// registry is the budgets by name, kept across reloads so that debt and in-flight counts
// survive. Compile reads it and Install replaces it, each under mu for a few map operations:
// never across a compile.
type registry struct {
	mu      sync.Mutex
	version uint64 // counts the Installs
	budgets map[string]*budget.Budget
	// installed is closed by the next Install, which makes a new one: a job in Wait between
	// two checks selects on it, so that a reload reaches it at once (replaced).
	installed chan struct{}
}

// replaced returns a channel that the next Install closes.
func (e *Engine) replaced() <-chan struct{} {
	e.reg.mu.Lock()
	defer e.reg.mu.Unlock()
	if e.reg.installed == nil {
		e.reg.installed = make(chan struct{})
	}
	return e.reg.installed
}

// replacedSince returns a channel closed once st is no longer the rule set in force: closed
// already when it was replaced before the call.
func (e *Engine) replacedSince(st *compiled) <-chan struct{} {
	ch := e.replaced()
	if e.state.Load() != st {
		return closedChan
	}
	return ch
}

// closedChan is a channel that is closed.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// Compile validates cfg and builds its immutable rule set, to be put in force by Install. It
// holds no lock while it compiles, and changes nothing a statement reads: budgets that keep their
// name are found in the rules in force and keep their state, and their new limits wait for
// Install. An invalid cfg is an error naming the problem.
func (e *Engine) Compile(cfg *rules.Config) (*Rules, error) {
	gen := e.gens.Add(1) // first: the order of the calls, whatever each then waits for
	if cfg == nil {
		cfg = &rules.Config{}
	}
	// Validated even when it comes from rules.Parse, which validated it: a Config is plain data
	// that the caller may have changed since, and a mark of "validated" would go stale.
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	now := e.now()
	warnLapsed(e.log, cfg, now)
	cores := serverCores(cfg)
	e.reg.mu.Lock()
	base, inForce := e.reg.version, e.reg.budgets
	e.reg.mu.Unlock() // inForce is never changed, only replaced (Install)
	c := &compiled{gen: gen, healthInterval: time.Duration(cfg.HealthInterval)}
	if c.healthInterval <= 0 {
		c.healthInterval = rules.DefaultHealthInterval
	}
	r := &Rules{c: c, base: base, quar: cfg.Budgets, byName: make(map[string]named, len(cfg.Budgets))}
	// Sized up front: a config may hold a budget per tenant.
	index := make(map[string]int, len(cfg.Budgets))
	c.budgets = make([]*budgetState, 0, len(cfg.Budgets))
	for i, b := range cfg.Budgets {
		spec := budget.Spec{
			MaxConcurrent:    deref(b.MaxConcurrent),
			PerQueryLimit:    time.Duration(b.PerQueryLimit).Seconds(),
			Rate:             deref(b.ServerShare) * cores,
			Burst:            time.Duration(b.BurstLimit).Seconds(),
			WarningThreshold: b.WarningThreshold,
			MaxKeys:          e.maxKeys,
			Keyless:          b.Per == "",
		}
		// Statements wait only under max_wait, at most max_queue of them per value.
		maxWait := time.Duration(b.MaxWait)
		if maxWait > 0 {
			spec.MaxQueue = b.QueueBound()
		}
		if spec.MaxQueue == 0 {
			maxWait = 0 // max_queue: 0 lets none wait
		}
		bb, ok := inForce[b.Name]
		if !ok {
			bb = budget.New(spec)
		}
		r.byName[b.Name] = named{bb, spec}
		index[b.Name] = i
		c.budgets = append(c.budgets, &budgetState{
			name:        b.Name,
			mode:        parseMode(b.Mode),
			b:           bb,
			per:         b.Per,
			needCost:    spec.PerQueryLimit > 0 || spec.Rate > 0,
			explain:     parseExplain(b.Explain),
			maxWait:     maxWait,
			queueFull:   budget.QueueLimit(spec.MaxQueue),
			throttle:    b.ThrottleWhen,
			closed:      closedBy(&b),
			maxDuration: time.Duration(b.MaxDuration),
			overrun:     &OverrunCause{budget: b.Name, bound: time.Duration(b.MaxDuration)},
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
		{vocab.GuardRequireWhere, cfg.Guards.RequireWhere, "UPDATE or DELETE without a WHERE that restricts rows"},
		{vocab.GuardBlockTruncate, cfg.Guards.BlockTruncate, "TRUNCATE"},
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
	return r, nil
}

// Current reports whether r's budgets were resolved against the rules in force: false once
// another Install came between r's Compile and now, when r must be compiled again to keep the
// state of the budgets that Install added.
func (e *Engine) Current(r *Rules) bool {
	e.reg.mu.Lock()
	defer e.reg.mu.Unlock()
	return r.base == e.reg.version
}

// Install puts r in force for the next statement: the kept budgets take their new limits and
// r's rules are swapped in. Its caller serialises Installs, and installs only a Current r.
// Statements are not held up: they read the rules in force until the swap.
//
// A removed budget whose statements still hold slots, or whose debt has not drained, stays in
// the registry (not in force) so that a later reload re-adding it finds its state; its
// statements release into it meanwhile. A reload that finds it idle forgets it.
func (e *Engine) Install(r *Rules) {
	now := e.now()
	keep := make(map[string]*budget.Budget, len(r.byName))
	for name, n := range r.byName {
		n.b.SetSpec(now, n.spec) // a new budget's is the one it was made with
		keep[name] = n.b
	}
	e.reg.mu.Lock()
	old := e.reg.budgets
	for name, bb := range old {
		if _, ok := keep[name]; !ok {
			if s := bb.Snapshot(now); s.InFlight > 0 || s.Debt > 0 {
				keep[name] = bb
			}
		}
	}
	e.reg.budgets = keep
	e.reg.version++
	installed := e.reg.installed
	e.reg.installed = nil
	e.reg.mu.Unlock()
	e.quarantined.configure(r.quar)
	e.state.Store(r.c)
	e.stats.Reloads.Add(1)
	if installed != nil {
		close(installed) // the jobs in Wait check again under these rules
	}
	// Statements waiting for room (max_wait) were routed by the rules replaced: each is decided
	// again under these (admission.go), at once rather than when a slot frees or its max_wait
	// ends, so that a reload that lifts a limit, closes a budget (max_concurrent: 0), turns it to
	// warn or removes it reaches them too. The budgets of both rule sets, a removed one's included.
	for _, bb := range old {
		bb.WakeWaiters()
	}
	for name, bb := range keep {
		if old[name] != bb {
			bb.WakeWaiters()
		}
	}
}

// serverCores is cfg's server_cores, or its default when cfg leaves it out: a Config built in
// code is validated but not given its defaults.
func serverCores(cfg *rules.Config) float64 {
	if cfg.ServerCores > 0 {
		return cfg.ServerCores
	}
	return rules.DefaultServerCores
}

func formatThreshold(metric string, value, threshold float64) string {
	if metric == rules.MetricReplicationLag {
		return fmt.Sprintf("%s=%s, threshold %s", metric,
			time.Duration(value*float64(time.Second)).Round(time.Millisecond),
			time.Duration(threshold*float64(time.Second)).Round(time.Millisecond))
	}
	return fmt.Sprintf("%s=%g, threshold %g", metric, value, threshold)
}
