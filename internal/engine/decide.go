package engine

import (
	"context"
	"database/sql/driver"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/internal/health"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// bypassKey is the context key of WithGuardBypass.
type bypassKey struct{}

// WithGuardBypass returns a context whose statements skip the query guards. It exists for
// deliberate bulk maintenance and is settable only from code: a SQL comment cannot set it,
// because comments can be injected.
func WithGuardBypass(ctx context.Context) context.Context {
	return context.WithValue(ctx, bypassKey{}, true)
}

func guardBypassed(ctx context.Context) bool {
	v, _ := ctx.Value(bypassKey{}).(bool)
	return v
}

// minRetry is the retry hint when a limit gives none (concurrency) and the pause of a max_wait loop.
const minRetry = 10 * time.Millisecond

// decide runs guards, rules, health, cost and admission for x. rt is the statement's cached
// route, or nil to route it afresh from x.Tags (and offer the result to slot); ctxTags are the
// context tags the route is for. On success the statement's holds are in x; on a denial nothing
// is held. The rare paths (guards, waiting, warn-mode budgets) are functions of their own, which
// keeps this one's frame small: it runs for every statement that a rule selects.
func (e *Engine) decide(ctx context.Context, st *compiled, x *Exec, rt *route, slot *routeSlot, ctxTags tagging.Tags,
	conn *stdlib.Conn, query string, args []driver.NamedValue) error {
	p := x.Pattern
	// Guards are static facts of the pattern, so they cost nothing unless a fact is set.
	if (p.UnsafeWrite || p.Truncate) && !guardBypassed(ctx) {
		if err := e.guard(st, x); err != nil {
			return err
		}
	}
	if st.rules == nil {
		return nil
	}
	if rt == nil {
		rt = e.route(st, x, ctxTags)
		if !p.UnsafeWrite && !p.Truncate {
			slot.offer(rt)
		}
	}
	if len(rt.budgets) == 0 {
		return nil
	}
	x.Budgets = rt.names
	if rt.needCost {
		x.Predicted, x.PlanCost = e.predict(ctx, x, slot, conn, query, args, rt.explain)
		x.Costed = true
	}

	// Enforce budgets are admitted together, all or nothing, possibly waiting up to max_wait.
	// A fresh route's requests are already in reqBuf: they are then copied onto themselves. One
	// assignment per request rather than append, whose copy is a call into the runtime.
	reqs, reqBudget := x.reqBuf[:0], rt.reqBudget
	if n := len(rt.reqs); n <= len(x.reqBuf) {
		reqs = x.reqBuf[:n]
		for i := range reqs {
			reqs[i] = rt.reqs[i]
			reqs[i].Cost = x.Predicted
		}
	} else {
		reqs = append(reqs, rt.reqs...)
		for i := range reqs {
			reqs[i].Cost = x.Predicted
		}
	}
	if d, wait := e.tryEnforce(st, x, rt, reqs, reqBudget); d != nil {
		if err := e.wait(ctx, st, x, rt, reqs, reqBudget, d, wait); err != nil {
			return err
		}
	}
	if rt.warn {
		e.warnBudgets(st, x, rt)
	}
	if x.Wants&WantDecisions != 0 {
		e.decisions(x)
	}
	return nil
}

// decideSimple is decide for a cached simple route (see route.simple) whose cost, if it needs
// one, the text's plan copy answers: most statements under rules, in one frame and without the
// general path's calls. The forecast is the text's, or the model's when the model changed since
// (as predict does). It returns handled false, having changed nothing, when the statement needs
// the general path (no cached plan, or a volatile pattern in explain mode auto).
// TestSimplePathMatchesGeneral holds it to decide's results.
func (e *Engine) decideSimple(ctx context.Context, st *compiled, x *Exec, rt *route, slot *routeSlot) (handled bool, err error) {
	if rt.needCost {
		c, pred, volatile, planned, hit := slot.costFor(x.at, e.model, x.Pattern.FingerprintID)
		if !planned {
			return false, nil
		}
		warm := true
		if !hit {
			pred, volatile, warm = e.forecast(slot, x.Pattern.FingerprintID, c)
		}
		if volatile && rt.explain == explainAuto {
			return false, nil
		}
		e.stats.ExplainCacheHits.Add(1)
		x.Predicted, x.PlanCost, x.Costed, x.warm = pred, c, true, warm
	}
	x.Budgets = rt.names
	reqs := x.reqBuf[:1]
	reqs[0] = rt.reqs[0]
	reqs[0].Cost = x.Predicted
	if warn, den := budget.AdmitAt(x.at, reqs, x.admitWarn[:0]); den != nil {
		d, wait := e.denied(st, x, rt, rt.reqBudget, den)
		if err := e.wait(ctx, st, x, rt, reqs, rt.reqBudget, d, wait); err != nil {
			return true, err
		}
	} else if len(warn) == 0 {
		x.holds = reqs // as admitted does, without its call
	} else {
		x.admitted(st, rt, reqs, rt.reqBudget, warn)
	}
	if x.Wants&WantDecisions != 0 {
		e.decisions(x)
	}
	return true, nil
}

// decisions reports each of x's budgets' own decision to the observer: warn where it warned,
// allow elsewhere.
func (e *Engine) decisions(x *Exec) {
	for _, name := range x.Budgets {
		decision, reason := DecisionAllow, ""
		for _, w := range x.warned {
			if w.budget == name {
				decision, reason = DecisionWarn, w.reason
			}
		}
		e.obs.Decision(name, decision, reason)
	}
}

// guard applies the query guards to x, whose pattern has an unsafe write or a TRUNCATE: an
// enforce guard blocks it, a warn guard notes it.
func (e *Engine) guard(st *compiled, x *Exec) error {
	p := x.Pattern
	for i := range st.guards {
		g := &st.guards[i]
		if g.mode == modeOff || !g.applies(p) || !g.matches(x.Tags) {
			continue
		}
		if g.mode == modeEnforce {
			d := &Denial{Budget: g.name, Rule: g.name, Reason: ReasonGuard, Fingerprint: p.Fingerprint, Limit: g.limit}
			x.Decision, x.Reason = DecisionBlock, ReasonGuard
			e.recordBlock(x.Start(), d, p)
			e.logDecision(g.name, DecisionBlock, d, p)
			return d
		}
		x.Decision, x.Reason = DecisionWarn, ReasonGuard
		e.noteWarn(g.name, &Denial{Budget: g.name, Rule: g.name, Reason: ReasonGuard, Fingerprint: p.Fingerprint, Limit: g.limit}, p)
		if x.Wants&WantDecisions != 0 {
			e.obs.Decision(g.name, DecisionWarn, ReasonGuard)
		}
	}
	return nil
}

// wait handles a denial d of x's enforce budgets: it blocks the statement unless the budget
// allows waiting (max_wait) and the hint wait fits both max_wait and ctx's deadline, in which
// case it waits and tries again, until admitted (nil) or blocked (the *Denial) or ctx ends.
func (e *Engine) wait(ctx context.Context, st *compiled, x *Exec, rt *route, reqs []budget.Request, reqBudget []int,
	d *Denial, wait time.Duration) error {
	var deadline time.Time
	for d != nil {
		bs := st.budgets[budgetByName(st, d.Budget)]
		now := e.now()
		if deadline.IsZero() {
			deadline = x.Start().Add(bs.maxWait)
		}
		if bs.maxWait <= 0 || wait <= 0 || now.Add(wait).After(deadline) || ctxEndsBefore(ctx, now.Add(wait)) {
			if d.Reason == ReasonHealth {
				bs.b.CountBlocked() // Admit counts its own denials; health is judged before it
			}
			x.Decision, x.Reason = DecisionBlock, d.Reason
			e.recordBlock(now, d, x.Pattern)
			e.logDecision(d.Budget, DecisionBlock, d, x.Pattern)
			return d
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		x.at = e.mono() // admission is decided at the current time
		x.slow = true
		d, wait = e.tryEnforce(st, x, rt, reqs, reqBudget)
	}
	return nil
}

// warnBudgets checks x's warn-mode budgets one by one: a warn budget that would block is logged
// and the statement runs without a hold in it, so the budget shows what enforce would have done.
func (e *Engine) warnBudgets(st *compiled, x *Exec, rt *route) {
	for i, bi := range rt.budgets {
		bs := st.budgets[bi]
		if bs.mode != modeWarn {
			continue
		}
		rule := rt.ruleOf[i]
		if d := e.healthDenial(st, bs, rule, x); d != nil {
			bs.b.CountWarned()
			x.warnBudget(e, bs.name, d)
			continue
		}
		req := [1]budget.Request{{Budget: bs.b, Key: rt.keys[i], Cost: x.Predicted}}
		var wb [1]budget.Warning
		warn, den := budget.AdmitAt(x.at, req[:], wb[:0])
		if den != nil {
			d := &Denial{Budget: bs.name, Rule: st.ruleName[rule], Reason: den.Reason, Fingerprint: x.Pattern.Fingerprint, Limit: den.Limit, RetryAfter: den.RetryAfter}
			x.warnBudget(e, bs.name, d)
			continue
		}
		x.hold(req[0])
		for _, w := range warn {
			e.thresholdWarn(x, bs, st.ruleName[rule], w)
		}
	}
}

// route makes x's route from its merged tags, in x's scratch space.
func (e *Engine) route(st *compiled, x *Exec, ctxTags tagging.Tags) *route {
	rt := &x.rt
	*rt = route{st: st, tags: ctxTags, budgets: x.selBuf[:0], ruleOf: x.ruleOfBuf[:0], names: x.nameBuf[:0], keys: x.keyBuf[:0],
		reqs: x.reqBuf[:0], reqBudget: x.reqIdxBuf[:0]}
	for _, r := range st.rules.Match(x.Tags, x.ruleBuf[:0]) {
		bi := st.ruleBudget[r]
		bs := st.budgets[bi]
		if bs.mode == modeOff || containsInt(rt.budgets, bi) {
			continue
		}
		key := ""
		if bs.per != "" {
			key, _ = tagValue(x.Tags, bs.per)
		}
		rt.budgets = append(rt.budgets, bi)
		rt.ruleOf = append(rt.ruleOf, r)
		rt.names = append(rt.names, bs.name)
		rt.keys = append(rt.keys, key)
		if bs.mode == modeEnforce {
			rt.reqs = append(rt.reqs, budget.Request{Budget: bs.b, Key: key})
			rt.reqBudget = append(rt.reqBudget, bi)
		}
		rt.warn = rt.warn || bs.mode == modeWarn
		rt.health = rt.health || (bs.mode == modeEnforce && len(bs.throttle) > 0)
		if bs.needCost {
			rt.needCost = true
			rt.explain = max(rt.explain, bs.explain) // the most eager explain mode wins: call > pattern > auto
		}
	}
	return rt
}

// warnBudget notes that budget warned about x (logged, rate-limited, and counted per budget).
func (x *Exec) warnBudget(e *Engine, budget string, d *Denial) {
	x.Decision, x.Reason = DecisionWarn, d.Reason
	if x.warned == nil {
		x.warned = x.warnBuf[:0]
	}
	x.warned = append(x.warned, budgetWarn{budget: budget, reason: d.Reason})
	e.noteWarn(budget, d, x.Pattern)
}

type budgetWarn struct{ budget, reason string }

// tryEnforce checks health and admits the enforce budgets. On success the holds are in x.
func (e *Engine) tryEnforce(st *compiled, x *Exec, rt *route, reqs []budget.Request, reqBudget []int) (*Denial, time.Duration) {
	budgets, ruleOf := rt.budgets, rt.ruleOf
	if rt.health {
		for i, bi := range budgets {
			bs := st.budgets[bi]
			if bs.mode != modeEnforce {
				continue
			}
			if d := e.healthDenial(st, bs, ruleOf[i], x); d != nil {
				return d, d.RetryAfter
			}
		}
	}
	if len(reqs) == 0 {
		return nil, 0
	}
	warn, den := budget.AdmitAt(x.at, reqs, x.admitWarn[:0])
	if den != nil {
		return e.denied(st, x, rt, reqBudget, den)
	}
	x.admitted(st, rt, reqs, reqBudget, warn)
	return nil, 0
}

// denied turns Admit's denial of x's requests into the statement's Denial, and the wait before
// a retry could fit (0 when none can).
func (e *Engine) denied(st *compiled, x *Exec, rt *route, reqBudget []int, den *budget.Denial) (*Denial, time.Duration) {
	bi := reqBudget[den.Index]
	bs := st.budgets[bi]
	d := &Denial{Budget: bs.name, Rule: st.ruleName[ruleFor(rt.budgets, rt.ruleOf, bi)], Reason: den.Reason,
		Fingerprint: x.Pattern.Fingerprint, Limit: den.Limit, RetryAfter: den.RetryAfter}
	wait := den.RetryAfter
	if den.Reason == ReasonPerQuery {
		wait = 0 // waiting cannot make a statement cheaper
	} else if wait <= 0 {
		wait = minRetry
	}
	return d, wait
}

// admitted keeps the requests Admit admitted as x's holds and notes its threshold warnings.
func (x *Exec) admitted(st *compiled, rt *route, reqs []budget.Request, reqBudget []int, warn []budget.Warning) {
	x.holds = reqs // Admit left its handles in them for Finish's Release
	for _, w := range warn {
		bi := reqBudget[w.Index]
		x.e.thresholdWarn(x, st.budgets[bi], st.ruleName[ruleFor(rt.budgets, rt.ruleOf, bi)], w)
	}
}

// ReasonWarningThreshold is the reason of a warning that a limit is nearly full.
const ReasonWarningThreshold = "warning_threshold"

// thresholdWarn notes that an admission left one of bs's limits at or above its warning_threshold.
func (e *Engine) thresholdWarn(x *Exec, bs *budgetState, rule string, w budget.Warning) {
	x.warnBudget(e, bs.name, &Denial{Budget: bs.name, Rule: rule, Reason: ReasonWarningThreshold,
		Fingerprint: x.Pattern.Fingerprint, Limit: fmt.Sprintf("%s at %.0f%%", w.Limit, w.Fill*100)})
}

// healthDenial reports a throttle_when threshold exceeded for bs, or nil.
func (e *Engine) healthDenial(st *compiled, bs *budgetState, rule int, x *Exec) *Denial {
	if len(bs.throttle) == 0 {
		return nil
	}
	sampler := e.sampler.Load()
	if sampler == nil {
		if _, ok := bs.throttle["in_flight"]; !ok || len(bs.throttle) != 1 {
			return nil
		}
		sampler = localOnly
	}
	metric, value, exceeded, stale := sampler.Evaluate(x.Start(), bs.throttle, float64(e.inFlight.Load()), bs.mode == modeEnforce)
	if !exceeded {
		return nil
	}
	limit := metric + " exceeded"
	if stale {
		limit = metric + " sample is stale"
	} else if th, ok := bs.throttle[metric]; ok {
		limit = formatThreshold(metric, value, th)
	}
	return &Denial{Budget: bs.name, Rule: st.ruleName[rule], Reason: ReasonHealth, Fingerprint: x.Pattern.Fingerprint,
		Limit: limit, RetryAfter: st.healthInterval}
}

// localOnly evaluates throttle_when when only in_flight (a local count) is used: no sampler runs.
var localOnly = health.NewSampler(health.Options{})

// hold keeps an admitted request (with Admit's handle to its state) for Finish to release.
func (x *Exec) hold(r budget.Request) {
	if x.holds == nil {
		x.holds = x.reqBuf[:0]
	}
	x.holds = append(x.holds, r)
}

// predict returns the predicted execution seconds and the planner cost it used (0 if none).
// EXPLAIN failures fall back to history and are counted; they never fail the statement.
func (e *Engine) predict(ctx context.Context, x *Exec, slot *routeSlot, conn *stdlib.Conn, query string, args []driver.NamedValue, mode explainMode) (float64, float64) {
	p := x.Pattern
	fp := p.FingerprintID
	// The common case first: a cached plan cost (the text's copy, else the plan cache's) and a
	// pattern that is not volatile, predicted from the text's forecast or else by the model.
	if p.Explainable && mode != explainCall {
		c, ok := slot.planCost(x.at)
		if !ok {
			var expires time.Time
			if c, expires, ok = e.plans.Lookup(x.Start(), fp); ok {
				slot.setPlan(c, e.clock(expires))
			}
		}
		if ok {
			pred, volatile, warm := e.forecast(slot, fp, c)
			if mode != explainAuto || !volatile {
				e.stats.ExplainCacheHits.Add(1)
				x.warm = warm
				return pred, c // pred is 0 when the model cannot predict
			}
		}
	}
	planCost := 0.0
	if p.Explainable {
		perCall := mode == explainCall || (mode == explainAuto && e.model.Volatile(fp))
		cached := false
		if !perCall {
			if c, ok := e.plans.Get(x.Start(), fp); ok {
				planCost, cached = c, true
				e.stats.ExplainCacheHits.Add(1)
			} else {
				e.stats.ExplainCacheMisses.Add(1)
			}
		}
		if !cached && conn != nil {
			x.slow = true
			e.stats.ExplainCalls.Add(1)
			t0 := e.now()
			c, err := cost.Explain(ctx, conn, query, args)
			if err != nil {
				e.stats.ExplainFailures.Add(1)
				e.log.Debug("pgtraffic: EXPLAIN failed; falling back to history", "fingerprint", p.Fingerprint, "error", err)
			} else {
				e.model.ObserveExplain(e.now().Sub(t0).Seconds())
				planCost = c
				if !perCall {
					e.plans.Put(t0, fp, c)
					slot.setPlan(c, e.clock(t0.Add(e.plans.TTL())))
				}
			}
		}
	}
	pred, ok := e.model.Predict(fp, planCost)
	if !ok {
		return 0, planCost
	}
	return pred, planCost
}

// warmSamples is the number of executions a pattern trains the cost model on before its
// forecasts are reused from the text's cache and its training is sampled (see Exec.train).
const warmSamples = 64

// forecast predicts the execution seconds of pattern fp at plan cost c, from the text's cached
// forecast when the model has not changed since (slot may be nil: no cache). warm reports a
// pattern past warmSamples executions; only such forecasts are cached.
func (e *Engine) forecast(slot *routeSlot, fp uint64, c float64) (seconds float64, volatile, warm bool) {
	if slot != nil {
		if s, v, hit := slot.forecast(c, e.model.Gen(fp)); hit {
			return s, v, true
		}
	}
	f := e.model.Forecast(fp, c)
	warm = f.Samples >= warmSamples
	if warm && f.Stable && slot != nil {
		slot.setForecast(c, f)
	}
	return f.Seconds, f.Volatile, warm
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func ruleFor(budgets, ruleOf []int, bi int) int {
	for i, b := range budgets {
		if b == bi {
			return ruleOf[i]
		}
	}
	return 0
}

func budgetByName(st *compiled, name string) int {
	for i, bs := range st.budgets {
		if bs.name == name {
			return i
		}
	}
	return 0
}

func ctxEndsBefore(ctx context.Context, t time.Time) bool {
	d, ok := ctx.Deadline()
	return ok && d.Before(t)
}
