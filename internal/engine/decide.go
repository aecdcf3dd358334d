package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/internal/health"
	"github.com/pgtraffic/pgtraffic/internal/ruleset"
)

// bypassKey is the context key of WithGuardBypass.
type bypassKey struct{}

// WithGuardBypass returns a context whose statements skip the query guards, for deliberate bulk
// maintenance. Only code can set it: comments can be injected.
func WithGuardBypass(ctx context.Context) context.Context {
	return context.WithValue(ctx, bypassKey{}, true)
}

func guardBypassed(ctx context.Context) bool {
	v, _ := ctx.Value(bypassKey{}).(bool)
	return v
}

// route is what the rule set makes of one statement's tags: the budgets it selects (not off),
// the rule that selected each, and each one's per-tag value.
type route struct {
	budgets []int    // indexes into st.budgets, each once, in rule order
	ruleOf  []int    // the rule that selected each
	keys    []string // each one's per-tag value; "" when it has no per
	names   []string // each one's name (Exec.Budgets)
	// reqs are the admission requests of the enforce budgets among them, without their cost,
	// and owners what each answers to.
	reqs     []budget.Request
	owners   []owner
	needCost bool // a selected budget needs a cost prediction
	explain  explainMode
	warn     bool // a selected budget is in warn mode
	health   bool // a selected enforce budget has throttle_when
	closed   bool // a selected budget is closed by a zero limit (limits.go)
	// quarantine: a selected budget has a quarantine (quarantine.go).
	quarantine bool
	// bound is the smallest max_duration of the enforce budgets (0: none), whose rule is
	// boundBy; warnBounds are the warn budgets with a max_duration (overrun.go).
	bound      time.Duration
	boundBy    int
	warnBounds []owner
}

// clone returns a copy of rt with storage of its own: rt's is an Exec's scratch, which its next
// statement reuses for its own route, while a copy saved for its text is read by others.
func (rt *route) clone() route {
	c := *rt
	c.budgets = slices.Clone(rt.budgets)
	c.ruleOf = slices.Clone(rt.ruleOf)
	c.keys = slices.Clone(rt.keys)
	c.names = slices.Clone(rt.names)
	c.reqs = slices.Clone(rt.reqs)
	c.owners = slices.Clone(rt.owners)
	c.warnBounds = slices.Clone(rt.warnBounds)
	return c
}

// route matches tags against st's rules in force at now into rt, reusing its storage.
func (st *compiled) route(tags []ruleset.KV, rt *route, ruleBuf []int, now time.Time) []int {
	*rt = route{budgets: rt.budgets[:0], ruleOf: rt.ruleOf[:0], keys: rt.keys[:0], names: rt.names[:0], reqs: rt.reqs[:0],
		owners: rt.owners[:0], warnBounds: rt.warnBounds[:0]}
	if st.rules == nil {
		return ruleBuf
	}
	ruleBuf = st.rules.Match(tags, ruleBuf[:0])
	for _, r := range ruleBuf {
		bi := st.ruleBudget[r]
		bs := st.budgets[bi]
		if bs.mode == modeOff || slices.Contains(rt.budgets, bi) || st.lapsed(r, now) {
			continue
		}
		key := ""
		if bs.per != "" {
			key = perValue(tags, bs.per)
		}
		rt.budgets = append(rt.budgets, bi)
		rt.ruleOf = append(rt.ruleOf, r)
		rt.keys = append(rt.keys, key)
		rt.names = append(rt.names, bs.name)
		if bs.mode == modeEnforce {
			rt.reqs = append(rt.reqs, budget.Request{Budget: bs.b, Key: key})
			rt.owners = append(rt.owners, owner{bs: bs, rule: r})
		}
		rt.warn = rt.warn || bs.mode == modeWarn
		rt.health = rt.health || (bs.mode == modeEnforce && len(bs.throttle) > 0)
		rt.closed = rt.closed || bs.closed != nil
		rt.quarantine = rt.quarantine || bs.quarantine != nil
		if bs.maxDuration > 0 {
			rt.noteBound(bs, r)
		}
		if bs.needCost {
			rt.needCost = true
			rt.explain = max(rt.explain, bs.explain) // the most eager explain mode wins: call > auto > pattern
		}
	}
	return ruleBuf
}

// perValue is the key of a budget's state for a statement with tags, from its tag per: the
// tag's first value, "" without one, hashed when long (budget.KeyOf). For table, a statement
// may name several tables, each as written and a qualified one's bare name too: it is keyed by
// the first bare name in name order, so that public.orders, "public"."orders" and orders count
// as one table, as they match {table: orders} alike (tables of the same name in two schemas
// count as one: more is refused, never less).
func perValue(tags []ruleset.KV, per string) string {
	if per != vocab.KeyTable {
		v, _ := tagValue(tags, per)
		return budget.KeyOf(v)
	}
	key, found := "", false
	for _, kv := range tags {
		if kv.Key != vocab.KeyTable {
			continue
		}
		bare := kv.Value[strings.LastIndexByte(kv.Value, '.')+1:]
		if !found || bare < key {
			key, found = bare, true
		}
	}
	return budget.KeyOf(key)
}

// decide runs guards, rules, health, cost and admission for x, sent as c. On success the
// statement's holds are in x; on a denial nothing is held. slow reports that an EXPLAIN was
// sent or the statement waited for capacity, so the statement's clock restarts.
func (e *Engine) decide(ctx context.Context, st *compiled, x *Exec, rt *route, c *call) (slow bool, err error) {
	if x.guarded = (x.Pattern.UnsafeWrite || x.Pattern.Truncate) && !guardBypassed(ctx); x.guarded {
		if err := e.guard(st, x, modeEnforce); err != nil {
			return false, err
		}
	}
	if len(rt.budgets) == 0 {
		return false, nil
	}
	x.Budgets = rt.names
	if rt.needCost {
		var later bool
		if slow, later, err = e.predict(ctx, st, x, rt, c); err != nil {
			return false, err
		}
		if later {
			return false, e.precheck(ctx, st, x, rt)
		}
		x.Costed = true
	}
	// Enforce budgets are admitted together, all or nothing, possibly waiting up to max_wait: their
	// requests, with this statement's cost, become its holds once admitted. The cost of a pattern
	// that has not run yet is unknown (its planner cost can say little about time: a pg_sleep
	// costs the planner almost nothing), and a budget charges the rest of a cost only when the
	// statement ends: each budget reserves it conservatively (budget.Request.Unknown) and trues
	// it up at Finish, so a cold start is admitted as far as budgets have room, never refused
	// for not knowing. A statement decided before it has a connection (x.later) holds pending
	// slots until it has one (budget.Request.Pending, Exec.Acquired).
	for _, r := range rt.reqs {
		r.Cost, r.Unknown, r.Pending = x.Predicted, x.untrained, x.later
		x.holds = append(x.holds, r)
	}
	waited, err := e.admit(ctx, st, x.claim(rt, x.holds), x.start, x.arrived)
	if err != nil {
		x.holds = x.holds[:0] // not admitted: nothing is held
		if err == ErrWaitBeforeConn {
			x.again = beforeConn
		}
		return false, err
	}
	if x.later {
		// For Acquired, should its slots be overtaken before it has its connection; its
		// decisions are counted once final, there or at Abandon (countLater).
		x.st = st
	}
	if rt.warn {
		// Judged when the enforce budgets admitted it, as enforce judges all of a statement's
		// budgets together: after a wait, its arrival is past, and a bucket has drained since.
		now := x.start
		if waited {
			now = e.now()
		}
		e.warnBudgets(st, x, rt, now)
	}
	if rt.bound > 0 || len(rt.warnBounds) > 0 {
		x.bind(st, rt)
	}
	if x.probe {
		x.probeBound(st, rt)
		e.stats.Probes.Add(1) // admitted: it runs (one refused for room counts no probe)
	}
	if rt.quarantine {
		x.noteQuarantinable(st, rt)
	}
	if !x.later {
		e.decisions(st, x, rt)
	}
	return slow || waited, nil
}

// claim is x's admission to the enforce budgets of rt with reqs, in x's storage.
func (x *Exec) claim(rt *route, reqs []budget.Request) *claim {
	cl := &x.s.claim
	if cl.x != x { // the first statement of this Exec: what every one of its claims shares
		*cl = claim{x: x, take: true, patience: maxWait, w: &x.s.waiter}
	}
	cl.rt, cl.reqs, cl.owners, cl.lent = rt, reqs, rt.owners, x.taken
	cl.health, cl.closed, cl.quarantine = rt.health, rt.closed, rt.quarantine
	return cl
}

// precheck decides x, routed to rt before it has a connection and whose cost needs an EXPLAIN
// on one, by what refuses it whatever it costs: its budgets' health thresholds, zero limits and
// quarantines, and their room: a free slot under each max_concurrent and room in each bucket
// and queue (waiting for them as max_wait allows), through the one admission path, as
// precheckBatch decides a batch. So a statement they refuse never takes a connection. While it
// waits it holds nothing but its place in its budgets' queues, as any statement does (bounded
// by max_queue, in arrival order): its requests are checked, not taken, as of an unknown cost,
// which a budget with a free slot and any room admits. It returns their refusal (recorded as any), ctx's
// error, or ErrNeedConn when they pass: the front end acquires the connection and decides x
// there (BeginTaken), as the same statement. It keeps the place of arrival it took in the
// queues, but holds none while it takes the connection and EXPLAINs: statements that arrived
// after it and need no EXPLAIN may run first.
func (e *Engine) precheck(ctx context.Context, st *compiled, x *Exec, rt *route) error {
	for _, r := range rt.reqs {
		r.Unknown, r.Pending = true, true
		x.holds = append(x.holds, r)
	}
	c := x.claim(rt, x.holds)
	c.take = false // its cost is priced on its connection, where it is admitted
	_, err := e.admit(ctx, st, c, x.start, x.arrived)
	c.take, x.holds = true, x.holds[:0]
	if err != nil {
		return err
	}
	x.again = onTaken
	x.s.waiter.Arrive() // should it wait on its connection or before one, in its place of arrival
	return ErrNeedConn
}

// decisions counts each of x's budgets' decision, warn where it warned, else allow, in the
// budget (for the status) and, when it wants them, for the observer: the two count alike.
func (e *Engine) decisions(st *compiled, x *Exec, rt *route) {
	for i, bi := range rt.budgets {
		decision, counted, reason := DecisionAllow, budget.Admitted, ""
		if len(x.warned) > 0 {
			if r, ok := x.warnedBy(rt.names[i]); ok {
				decision, counted, reason = DecisionWarn, budget.Warned, r
			}
		}
		st.budgets[bi].b.Count(x.start, counted, reason)
		if x.Wants&WantDecisions != 0 {
			e.obs.Decision(rt.names[i], decision, reason)
		}
	}
}

// warnedBy reports the reason of budget's last warning about x, if it warned.
func (x *Exec) warnedBy(budget string) (reason string, ok bool) {
	for _, w := range x.warned {
		if w.Budget == budget && !w.guard {
			reason, ok = w.Reason, true
		}
	}
	return reason, ok
}

// limitUnparsable is a guard's Limit text for a statement pg_query cannot parse: without a parse
// tree a guard cannot see its WHERE, so a text that may write is refused (see pattern.unparsable).
const limitUnparsable = "statement pgtraffic cannot parse that may hold an UPDATE, DELETE, MERGE or TRUNCATE"

// guard applies the query guards of mode to x, which they apply to (Exec.guarded): an enforce guard
// (mode modeEnforce) blocks it, a warn guard (modeWarn) notes it. The enforce guards decide
// first, before anything is held; the warn guards note a statement once its decision is made
// (warnGuards), so that a decision made again (on the connection after ErrNeedConn, under new
// rules after a wait) warns once.
func (e *Engine) guard(st *compiled, x *Exec, m mode) error {
	p := x.Pattern
	for i := range st.guards {
		g := &st.guards[i]
		if g.mode != m || !g.applies(p) || !g.matches(x.Tags) {
			continue
		}
		d := &Denial{Budget: g.name, Rule: g.name, Reason: vocab.ReasonGuard, Fingerprint: p.Fingerprint, Limit: g.limit}
		if !p.Parsed {
			d.Limit = limitUnparsable // say why: the statement may well have a WHERE
		}
		if g.mode == modeEnforce {
			x.Decision, x.Reason, x.Blocker = DecisionBlock, vocab.ReasonGuard, g.name
			e.recordBlock(x.start, d, p)
			e.logDecision(g.name, DecisionBlock, d, p)
			return d
		}
		x.warnGuard(e, g.name, d)
		if x.Wants&WantDecisions != 0 {
			e.obs.Decision(g.name, DecisionWarn, vocab.ReasonGuard)
		}
	}
	return nil
}

// warnGuards notes the warn guards under st of x, which they apply to (Exec.guarded), once it
// is admitted (err nil): a warning says what enforce would refuse of what runs, as a warn
// budget's does (warnBudgets), so a statement refused is noted by none (its span and its log
// line say block), nor one whose decision ends with ErrNeedConn or ErrWaitBeforeConn, which the
// front end makes again.
func (e *Engine) warnGuards(st *compiled, x *Exec, err error) {
	if x.guarded && err == nil {
		_ = e.guard(st, x, modeWarn) // a warn guard refuses nothing
	}
}

// warnBudgets checks x's warn-mode budgets one by one: a warn budget that would block is logged
// and the statement runs without a hold in it, so the budget shows what enforce would have done.
// Under max_wait enforce would have a statement wait for room rather than refuse it while its
// queue has room and the wait looks no longer than max_wait: such a statement runs unwarned,
// holding its slot and cost over the limits as a would-be waiter (budget.TakeWaiter), so that
// the warnings count what enforce would refuse, not what it would make wait.
func (e *Engine) warnBudgets(st *compiled, x *Exec, rt *route, now time.Time) {
	for i, bi := range rt.budgets {
		bs := st.budgets[bi]
		if bs.mode != modeWarn {
			continue
		}
		rule := rt.ruleOf[i]
		if d := e.refusedWhatever(st, bs, rule, x, now); d != nil {
			x.warnBudget(e, bs.name, d)
			continue
		}
		req := [1]budget.Request{{Budget: bs.b, Key: rt.keys[i], Cost: x.Predicted, Unknown: x.untrained}}
		warn, den := budget.Admit(now, req[:], x.s.claim.warns[:0])
		if den != nil {
			if budget.TakeWaiter(now, &req[0], den, bs.maxWait) {
				x.holds = append(x.holds, req[0])
			} else {
				x.warnBudget(e, bs.name, bs.denial(st, rule, x, den))
			}
			continue
		}
		x.holds = append(x.holds, req[0])
		for _, w := range warn {
			e.thresholdWarn(x, bs, st.ruleName[rule], w)
		}
	}
}

// refusedWhatever returns what would refuse x in warn budget bs, selected by rule, at now
// whatever its cost (a zero limit, a health threshold, a quarantine of its pattern), or nil: a
// warn budget warns about what enforce would refuse, its requests aside.
func (e *Engine) refusedWhatever(st *compiled, bs *budgetState, rule int, x *Exec, now time.Time) *Denial {
	if d := bs.closedDenial(st, rule, x, now); d != nil {
		return d
	}
	if d := e.healthDenial(st, bs, rule, x, now); d != nil {
		return d
	}
	return e.quarantineDenial(st, bs, rule, x, now)
}

// warnBudget notes that budget warned about x (logged, rate-limited, and counted per budget). A
// statement refused stays refused (decision block).
func (x *Exec) warnBudget(e *Engine, budget string, d *Denial) {
	if x.Decision != DecisionBlock {
		x.Decision, x.Reason = DecisionWarn, d.Reason
	}
	x.warned = append(x.warned, Warning{Budget: budget, Reason: d.Reason})
	e.noteWarn(budget, d, x.Pattern)
}

// warnGuard notes that guard warned about x, as warnBudget notes a budget's warning.
func (x *Exec) warnGuard(e *Engine, guard string, d *Denial) {
	x.warnBudget(e, guard, d)
	x.warned[len(x.warned)-1].guard = true // no budget's decision (decisions)
}

// Warning is one warning about a statement (Exec.Warnings): the budget or guard that warned,
// and why (a reason of driver/rules/vocab).
type Warning struct {
	Budget, Reason string
	guard          bool // a guard's warning, which no budget of the same name counts
}

// Warnings returns the warnings about x, in the order they were made: at Begin by its guards
// and budgets, and at Finish by a warn budget's max_duration. Read-only, valid until x's next
// Begin.
func (x *Exec) Warnings() []Warning { return x.warned }

// thresholdWarn notes that an admission left one of bs's limits at or above its warning_threshold.
func (e *Engine) thresholdWarn(x *Exec, bs *budgetState, rule string, w budget.Warning) {
	x.warnBudget(e, bs.name, &Denial{Budget: bs.name, Rule: rule, Reason: vocab.ReasonWarningThreshold,
		Fingerprint: x.Pattern.Fingerprint, Limit: fmt.Sprintf("%s at %.0f%%", w.Limit, w.Fill*100)})
}

// healthDenial reports a throttle_when threshold of bs exceeded at now, or nil. Once the engine
// is closed its health sampler is stopped, and no sample will come: the statements that still
// run on connections opened before (database/sql closes a connection in use when it is given
// back) are no longer throttled, rather than refused as stale for good.
func (e *Engine) healthDenial(st *compiled, bs *budgetState, rule int, x *Exec, now time.Time) *Denial {
	if len(bs.throttle) == 0 || e.Closed() {
		return nil
	}
	sampler := e.health.Load()
	if sampler == nil {
		if _, ok := bs.throttle[rules.MetricInFlight]; !ok || len(bs.throttle) != 1 {
			return nil
		}
		sampler = localOnly
	}
	inFlight := e.inFlight.Load()
	if x.later {
		// As its slots would be (budget.Request.Pending): the pool's statements admitted before
		// it and still waiting for their connections count too; a statement on a held
		// connection counts the running ones only, for those may wait for the one it holds.
		inFlight += e.pending.Load()
	}
	metric, value, exceeded, stale := sampler.Evaluate(now, bs.throttle, float64(inFlight), bs.mode == modeEnforce)
	if !exceeded {
		return nil
	}
	limit := metric + " exceeded"
	if stale {
		// What the front end's error says: the pool decides before it takes a connection, so
		// while the server is unreachable its statements meet this rather than pgx's error.
		limit = metric + " sample is stale (no recent reading: the server unreachable, or the health query failing)"
	} else if th, ok := bs.throttle[metric]; ok {
		limit = formatThreshold(metric, value, th)
	}
	return &Denial{Budget: bs.name, Rule: st.ruleName[rule], Reason: vocab.ReasonHealth, Fingerprint: x.Pattern.Fingerprint,
		Limit: limit, RetryAfter: st.healthInterval}
}

// localOnly evaluates throttle_when when only in_flight (a local count) is used: no sampler runs.
var localOnly = health.NewSampler(health.Options{})

// predict predicts x's execution seconds into x.Predicted, with the planner cost it used in
// x.PlanCost (0 if none), and reports whether it sent an EXPLAIN (of c, on its connection) or
// waited for another statement's EXPLAIN of its pattern (explaining), so that its clock restarts.
// EXPLAIN failures fall back to history and are counted; they never fail the statement, but for
// one that ctx ended (its caller gave up while it was explained: err is ctx's), after which the
// statement could not run either (pgx closes a connection whose statement it cancels). needConn
// reports, for a statement with no connection yet (x.later), that it would EXPLAIN: nothing else
// is set or counted. The EXPLAIN runs under rt's max_duration (explainContext): one cut off
// by it answers the statement with an error matching ErrOverrun, nothing else sent.
func (e *Engine) predict(ctx context.Context, st *compiled, x *Exec, rt *route, c *call) (sent, needConn bool, err error) {
	mode := rt.explain
	p := x.Pattern
	fp := p.FingerprintID
	pred := e.model.Predict(x.start, fp, 0)
	x.untrained, x.server, x.identified = pred.Samples == 0, pred.Server, pred.Identified
	// Under call every statement is explained, a pool statement on the connection it takes
	// first. Under auto a volatile pattern is explained per call where the statement has its
	// connection; a pool statement decided before it has one (x.later) is priced by the
	// pattern's cached plan, so that it waits for room holding no connection.
	x.perCall = mode == explainCall || (mode == explainAuto && pred.Volatile)
	perCall := mode == explainCall || x.perCall && !x.later
	if pred.Cached && !perCall {
		e.stats.ExplainCacheHits.Add(1)
		x.warm = pred.Samples >= warmSamples
		x.Predicted, x.PlanCost = pred.Seconds, pred.PlanCost
		return false, false, nil
	}
	return e.predictExplained(ctx, st, x, rt, c, pred, perCall)
}

// predictExplained is predict for x when its pattern's cached plan does not price it (none is
// cached, or x is explained per call, perCall): it EXPLAINs c on its connection, or waits for
// the EXPLAIN of its pattern on its way, and predicts from the plan's cost; without one, pred,
// the model's prediction from history, stands.
func (e *Engine) predictExplained(ctx context.Context, st *compiled, x *Exec, rt *route, c *call, pred cost.Prediction,
	perCall bool) (sent, needConn bool, err error) {
	p := x.Pattern
	fp := p.FingerprintID
	planCost := 0.0
	if p.Explainable {
		if !perCall {
			// One EXPLAIN caches the pattern's plan: a statement of it that comes while that
			// EXPLAIN is on its way waits for it (as long as ctx allows) and is priced by its
			// plan; a statement that will EXPLAIN leads.
			done, leads := e.explains.join(fp, c.conn != nil)
			switch {
			case leads:
				defer e.explains.end(fp)
				if e.model.Predict(x.start, fp, 0).Cached {
					// The pattern's EXPLAIN ended between this statement's prediction and its
					// join: its plan prices it, no second EXPLAIN.
					return e.predict(ctx, st, x, rt, c)
				}
			case done != nil && c.conn != nil && c.conn.InTransaction():
				// A statement in a transaction EXPLAINs on its own connection instead: the
				// EXPLAIN on its way may wait for a lock the transaction holds, which waiting
				// for it would hold for ever.
			case done != nil:
				return e.awaitExplain(ctx, st, x, rt, c, pred, done)
			}
		}
		if c.conn == nil && x.later {
			return false, true, nil
		}
		if !perCall {
			e.stats.ExplainCacheMisses.Add(1)
		}
		if c.conn != nil {
			if d := e.refusedUnpriced(st, x, rt); d != nil {
				return false, false, d
			}
			t0 := e.now()
			ectx, stop := e.explainContext(ctx, st, rt)
			plan, err := c.conn.Explain(ectx, c.query, c.args)
			// Read before stop, which cancels ectx: non-nil only when its bound, a reload (or
			// ctx) ended it.
			cut := context.Cause(ectx)
			stop()
			if err != nil && cut == errRulesChanged && ctx.Err() == nil {
				// A reload cut it off: the statement is decided again under the rules in force.
				e.stats.ExplainCalls.Add(1)
				return true, false, errRulesChanged
			}
			if err != nil {
				var answer error
				if sent, answer = e.explainFailed(ctx, st, x, rt, cut, err, perCall, t0); answer != nil {
					return true, false, answer
				}
			} else {
				sent = true
				e.stats.ExplainCalls.Add(1)
				e.model.ObserveExplain(e.now().Sub(t0).Seconds())
				planCost = plan.Cost
				// Cached also when explained per call: the pattern's latest plan prices its
				// statements decided before their connection (volatile ones under auto).
				e.model.PutPlan(t0, fp, plan.Cost)
				e.model.PutQueryID(fp, p.Normalized, plan.QueryID)
			}
		}
	}
	if planCost == 0 {
		// Not explained: the first prediction stands (the cached plan cost while fresh, else history).
		x.Predicted, x.PlanCost = pred.Seconds, pred.PlanCost
		return sent, false, nil
	}
	pred = e.model.Predict(x.start, fp, planCost)
	x.server, x.identified = pred.Server, pred.Identified
	x.Predicted, x.PlanCost, x.explained = pred.Seconds, planCost, true
	return sent, false, nil
}

// awaitExplain is predictExplained for x when the EXPLAIN of its pattern is on its way, done
// closed when it ends: x waits for it, as long as ctx allows, the engine is open and the rules
// it was routed by, st, stand (replaced, it is decided again: errRulesChanged), unless what
// refuses it whatever it costs refuses it first (refusedUnpriced). Then it is priced by the
// plan that EXPLAIN cached; or, the EXPLAIN cut off or failed (a migration's lock held it past
// a lock_timeout or a max_duration), from history, pred, as a statement whose own EXPLAIN
// failed: not explained anew, or the statements waiting for it would each wait for the same
// lock in turn. It waited: its clock restarts (sent).
func (e *Engine) awaitExplain(ctx context.Context, st *compiled, x *Exec, rt *route, c *call, pred cost.Prediction,
	done <-chan struct{}) (sent, needConn bool, err error) {
	if d := e.refusedUnpriced(st, x, rt); d != nil {
		return false, false, d
	}
	select {
	case <-done:
	case <-ctx.Done():
		return true, false, ctx.Err()
	case <-e.done: // closed: it would wait, and is answered at once (Close)
		return true, false, ErrClosed
	case <-e.replacedSince(st):
		return true, false, errRulesChanged
	}
	if e.model.Predict(x.start, x.Pattern.FingerprintID, 0).Cached {
		_, needConn, err = e.predict(ctx, st, x, rt, c)
		return true, needConn, err
	}
	x.Predicted, x.PlanCost = pred.Seconds, pred.PlanCost
	return true, false, nil
}

// refusedUnpriced returns the refusal of x, routed to rt under st, by what refuses it whatever
// it costs and however long it waits: a zero limit or a quarantine of one of its enforce
// budgets, recorded as any refusal; nil when none refuses it. It is checked before x's
// EXPLAIN is sent, or waited for, so that a statement they refuse does not wait for an EXPLAIN
// that a lock holds (a tenant shut off with max_concurrent: 0 during an incident is refused at
// once); its admission checks the rest once its cost is known. A statement of a batch is
// refused with its batch, once the batch is decided whole.
func (e *Engine) refusedUnpriced(st *compiled, x *Exec, rt *route) *Denial {
	if x.InBatch || !rt.closed && !rt.quarantine {
		return nil
	}
	c := x.claim(rt, nil)
	c.health = false // a health threshold may be waited for: judged at its admission
	o, d, _ := e.try(st, c, x.start)
	if d != nil {
		e.refuse(x.start, c, o, d)
	}
	return d
}

// explainFailed accounts for x's EXPLAIN, begun at t0, that failed with err (cut: the cause
// that ended it under explainContext, if any). It reports whether the EXPLAIN reached the
// server (sent), and answer: the statement's answer when the failure is one, nothing else sent;
// nil when x falls back to history.
func (e *Engine) explainFailed(ctx context.Context, st *compiled, x *Exec, rt *route, cut, err error, perCall bool,
	t0 time.Time) (sent bool, answer error) {
	if errors.Is(err, cost.ErrNotSent) {
		// Nothing reached the server (an aborted transaction, a busy connection): no call to
		// count. Arguments the EXPLAIN cannot encode fail it for the pattern, as a call that
		// failed does (below), but nothing was sent.
		if errors.Is(err, cost.ErrUnencodable) {
			e.stats.ExplainFailures.Add(1)
			e.planFailed(x, err, perCall, t0)
		}
		return false, nil
	}
	e.stats.ExplainCalls.Add(1)
	if ctx.Err() != nil {
		// Its caller gave up: not the pattern's failure, and nothing to run.
		return true, callerEnded(ctx, err)
	}
	e.stats.ExplainFailures.Add(1)
	switch {
	case cut != nil:
		// Its max_duration passed while it was explained (a lock it waits for, a planner that
		// takes long): sent, it would run past it. Not the pattern's failure either.
		return true, e.explainOverran(st, x, rt, cut, err)
	case errors.Is(err, cost.ErrCancelled):
		// The server cut the EXPLAIN off (the session's lock_timeout or statement_timeout):
		// sent, the statement would wait for the same lock again. It is answered with the
		// server's error; the pattern is explained again next time (a lock is not the
		// pattern's failure).
		return true, err
	case errors.Is(err, cost.ErrConnLost) && x.taken:
		// The connection the pool lent it alone closed under its EXPLAIN (the server ended the
		// session): nothing runs there, and nothing was decided on it. The front end gives it
		// back and decides the statement again before another, in its place of arrival: one
		// decision, one span for the statement.
		x.again = beforeConn
		return true, ErrWaitBeforeConn
	case errors.Is(err, cost.ErrConnLost):
		// The connection its caller holds (database/sql's, a transaction's) closed under its
		// EXPLAIN: the statement cannot run there either. It is answered with the connection's
		// error, the server's when it ended the session, as it would have been without
		// pgtraffic, not sent to meet a closed connection.
		return true, err
	}
	e.planFailed(x, err, perCall, t0)
	return true, nil
}

// planFailed notes that x's EXPLAIN at t0 failed with err for its pattern: the statement falls
// back to the pattern's history, and, explained per pattern, the pattern is not explained again
// before the plan's TTL.
func (e *Engine) planFailed(x *Exec, err error, perCall bool, t0 time.Time) {
	e.log.Debug("pgtraffic: EXPLAIN failed; falling back to history", fingerprintAttr(x.Pattern), "error", err)
	if !perCall {
		e.model.PutPlanFailed(t0, x.Pattern.FingerprintID)
		x.explainFailed = true
	}
}

// callerEnded is the error of a statement whose caller's context ctx ended during its EXPLAIN,
// which failed with err: the connection's error for it when err is one (pgx's timeout, as the
// statement would have had it without pgtraffic), else ctx's.
func callerEnded(ctx context.Context, err error) error {
	if errors.Is(err, ctx.Err()) {
		return err
	}
	return ctx.Err()
}

func ctxEndsBefore(ctx context.Context, t time.Time) bool {
	d, ok := ctx.Deadline()
	return ok && d.Before(t)
}
