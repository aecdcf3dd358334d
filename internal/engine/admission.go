package engine

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"

	"github.com/pgtraffic/pgtraffic/internal/budget"
)

// Admission. A statement, a pgx batch and a job's Check are admitted by one function, admit
// (a job's Wait checks until Check passes: check.go): the same checks in the same order (health thresholds, zero limits, quarantined
// patterns, then the enforce budgets' slots and buckets, all or nothing), one way to wait (a
// place in the budgets' queues, admitted in arrival order: internal/budget's queue.go), and
// one place that records a refusal (refuse).
//
// A statement waits only under a budget with max_wait, for what waiting can give: a slot, room
// in the bucket, a healthy sample; up to the max_wait of the budget that refuses it, counted
// from its arrival. It joins the queue of each of its budgets that lets statements wait
// (max_wait, at most max_queue waiting per budget and per value), the first time it is
// refused, and tries again when it is woken: when room is made that may be its (a slot of its
// key released, a waiter ahead of it leaving), when a shared budget's lease changes, when a
// health sample arrives, or when its bucket has drained enough (a timer at the denial's
// RetryAfter: exact, or behind other waiters when the bucket has room for it beside theirs).
// A refusal that waiting cannot lift (a zero limit, a quarantine, a per_query_limit) is final
// at once.

// owner is what an admission's request answers to: its enforce budget, the rule that selected
// it, and the statement a denial names (the index of a batch's statement; 0 for one statement).
type owner struct {
	bs   *budgetState
	rule int
	stmt int
}

// claim is one admission: what a statement (x, routed to rt), a batch (b) or a job's Check asks
// of its enforce budgets. It lives in its Exec's or Batch's storage, reused from one admission
// to the next.
type claim struct {
	x      *Exec            // the statement (Check's stand-in for a job's); nil for a batch
	rt     *route           // x's route
	b      *Batch           // the batch; nil for a statement
	reqs   []budget.Request // one per enforce budget and key; they hold nothing until admitted
	owners []owner          // owners[i] answers for reqs[i]
	// health, closed and quarantine say whether an owner may be throttled, closed by a zero
	// limit or have a quarantined pattern: the checks the claim needs.
	health, closed, quarantine bool
	take                       bool // take the holds; Check, and a precheck before the cost is known, take nothing
	// job: the claim is a job's Check or Wait, which refuses no statement: its refusal is
	// not recorded (refuse).
	job bool
	// lent says its statement or batch is on a connection the pool lent it alone (BeginTaken,
	// BeginBatchTaken, Acquired). Held back by a health threshold, at once or while it waits
	// for capacity there, it does not wait for health holding that connection but answers
	// ErrWaitBeforeConn, to be decided again before one in its place of arrival: a health
	// threshold refuses whatever a statement costs, and the pool's statements wait for it
	// holding none (precheck), however long an EXPLAIN or a wait took meanwhile.
	lent     bool
	patience patience
	w        *budget.Waiter // its place in the queues, kept with its Exec or Batch
	warns    []budget.Warning
}

// patience is how long a claim may wait for capacity.
type patience uint8

const (
	noWait  patience = iota // Check: refused at once
	maxWait                 // a statement or batch: up to the refusing budget's max_wait, in a bounded queue
	turn                    // Wait: its turn in the same queues, as long as its context allows; it takes nothing
)

// noDeadline is how long a wait for its turn (patience turn) under a context without a
// deadline may last: in effect, for ever.
const noDeadline = 100 * 365 * 24 * time.Hour

// deadline is when c's wait ends while owner o's budget refuses it: o's max_wait after arrived,
// whichever budget refused c before; for a job's Wait (turn), when ctx ends.
func (c *claim) deadline(ctx context.Context, o owner, arrived time.Time) time.Time {
	if c.patience != turn {
		return arrived.Add(o.bs.maxWait)
	}
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return arrived.Add(noDeadline)
}

// wake is what may lift a refusal: the event a waiting claim waits for.
type wake uint8

const (
	wakeNever  wake = iota // a zero limit, a quarantine, a per_query_limit: waiting cannot help
	wakeTurn               // a slot or its turn (a release, a lease, a waiter leaving); queued for the bucket, its RetryAfter too
	wakeAt                 // room in the bucket: exactly at the denial's RetryAfter
	wakeHealth             // a health sample below the threshold
)

// exec is the statement that owner o's denial names.
func (c *claim) exec(o owner) *Exec {
	if c.b != nil {
		return &c.b.Execs[o.stmt]
	}
	return c.x
}

// index is the index of c's first request of owner o's budget: where o's refusal waits, for
// the budgets' queues (budget.Join, budget.Hold).
func (c *claim) index(o owner) int {
	for i := range c.owners {
		if c.owners[i].bs == o.bs {
			return i
		}
	}
	return 0
}

// leave takes the claim out of the queues it waits in, if any.
func (c *claim) leave() {
	if c.w.Waiting() {
		budget.Leave(c.w, c.reqs)
	}
}

// admit admits c at now, waiting as its patience allows, its max_wait counted from arrived
// (now, or earlier for a claim decided again). It returns nil once admitted (c.reqs are then
// held when c.take), the *Denial that refuses it (recorded by refuse), ctx's error when ctx
// ends while it waits, or errRulesChanged when st is no longer the rule set in force (replaced
// while its statement was explained, or waited for its pattern's EXPLAIN, or for room: see
// await); waited reports a wait.
func (e *Engine) admit(ctx context.Context, st *compiled, c *claim, now, arrived time.Time) (waited bool, err error) {
	if e.state.Load() != st {
		return false, errRulesChanged // so a reload that closes a budget reaches it too
	}
	o, d, how := e.try(st, c, now)
	if d == nil {
		return false, nil
	}
	return e.await(ctx, st, c, now, arrived, o, d, how)
}

// readmit admits c again, at start, on the connection its statement or batch now holds, after
// a hold of it was overtaken while it waited for that connection (Exec.admitAgain,
// Batch.admitAgain): its max_wait there counts from start, in arrived. When the rules were
// replaced while it waited, it returns ErrDecideAgain and again: the front end has what
// routing it afresh needs (its text and tags), and it keeps its place of arrival. After a wait
// for capacity start restarts: the wait is not the statement's cost.
func (e *Engine) readmit(ctx context.Context, st *compiled, c *claim, start, arrived *time.Time) (again bool, err error) {
	*arrived = *start
	waited, err := e.admit(ctx, st, c, *start, *arrived)
	switch {
	case err == errRulesChanged:
		return true, ErrDecideAgain
	case err == nil && waited:
		*start = e.now()
	}
	return false, err
}

// errRulesChanged is await's answer when the rules it decided a claim by were replaced while
// the claim waited: nothing is held, and the caller decides it again under the rules in force
// (a reload wakes every waiter: Engine.Install).
var errRulesChanged = errors.New("engine: the rules changed while the statement waited")

// await is admit after a first refusal, d of owner o at start: it refuses c, or waits in the
// queues for what may lift the refusal (how) and tries again, until admitted or refused (or,
// lent a connection and held back by health, sent to wait before one: ErrWaitBeforeConn), each
// refusal judged by the max_wait of the budget that makes it (claim.deadline), so that a
// statement of several budgets waits no longer for one than that budget allows, whichever
// refused it first. A statement or batch whose rules were replaced since
// it was routed, or one of whose rules lapsed (until), leaves the queues with errRulesChanged,
// to be decided again under the rules in force.
func (e *Engine) await(ctx context.Context, st *compiled, c *claim, start, arrived time.Time, o owner, d *Denial,
	how wake) (waited bool, err error) {
	defer c.leave() // on every path, a panic in an observer or a logger included
	// Under an in_flight threshold the claim also watches the ends of the engine's statements
	// (ends): ended is closed by the first end after the last check.
	var ended <-chan struct{}
	defer func() {
		if ended != nil {
			e.ends.unwatch()
		}
	}()
	// A rule that lapses meanwhile (until) may be one that routed it: it is routed again then,
	// as after a reload, in its place of arrival.
	lapse := st.nextLapse(start)
	for now := start; ; {
		deadline := c.deadline(ctx, o, arrived)
		joined, stop := e.stay(ctx, st, c, o, d, how, now, deadline)
		if stop != nil {
			return waited, stop
		}
		if joined {
			waited = true
			// A slot released before it joined woke nobody: try once more now.
			if now, o, d, how, err = e.retry(st, c); err != nil || d == nil {
				return waited, err
			}
			continue
		}
		if _, local := o.bs.throttle[rules.MetricInFlight]; how == wakeHealth && local && ended == nil {
			e.ends.watch()
			ended = e.ends.next()
			// A statement that ended since the check woke nobody: try once more now.
			if now, o, d, how, err = e.retry(st, c); err != nil || d == nil {
				return waited, err
			}
			continue
		}
		wait, sampled := e.waitFor(d, how, now, deadline, lapse)
		select {
		case <-ctx.Done():
			// Its caller gave up while the budget held it back: a refusal for what it waited
			// for, counted as one (its caller is answered with ctx's error).
			e.refuse(e.now(), c, o, d)
			return waited, ctx.Err()
		case <-c.w.Wake():
		case <-e.after(wait):
		case <-sampled:
		case <-ended:
		}
		if ended != nil {
			ended = e.ends.next() // before the check: an end after it closes this one
		}
		if full, bound := budget.Evicted(c.w, c.reqs); full >= 0 {
			// One that arrived before it came back to its queue after a reload and left it
			// beyond the bound (the reload's): refused as if it had found the queue full.
			o, d = c.queueFull(st, full, d, budget.QueueLimit(bound))
			e.refuse(e.now(), c, o, d)
			return waited, d
		}
		if !lapse.IsZero() && !e.now().Before(lapse) {
			return waited, errRulesChanged
		}
		if now, o, d, how, err = e.retry(st, c); err != nil || d == nil {
			return waited, err
		}
	}
}

// stay is await's step after c, decided under st, was refused by d of owner o at now (how): c
// is refused (the refusal recorded, d returned) when it may not wait or finds a queue full; it
// is sent to wait before a connection (ErrWaitBeforeConn) when it is on one lent to it and
// health holds it back (it leaves the queues, keeping its place of arrival); else it keeps its
// place in the queues, joined reporting that it joined them now.
//
// A full queue refuses c as the budget whose queue it is: the one that held c back, or another
// of c's budgets, whose max_queue c could not wait within. The limit names the full queue,
// the reason what c would have waited for: with the queue full of statements waiting for the
// bucket, a slot may be what a newcomer behind them waits for while one statement runs.
func (e *Engine) stay(ctx context.Context, st *compiled, c *claim, o owner, d *Denial, how wake, now, deadline time.Time) (
	joined bool, err error) {
	if !c.mayWait(ctx, o, d, how, now, deadline) {
		e.refuse(now, c, o, d)
		return false, d
	}
	if how == wakeHealth && c.lent {
		return false, ErrWaitBeforeConn
	}
	joined, full := c.enqueue(o, d, how)
	if full >= 0 {
		o, d = c.queueFull(st, full, d, c.owners[full].bs.queueFull)
		e.refuse(now, c, o, d)
		return false, d
	}
	return joined, nil
}

// queueFull is c's refusal, decided under st, by the queue of its full-th request's budget,
// which it found full or was put out of: d, what it waited for, named by that budget and limit
// (its max_queue).
func (c *claim) queueFull(st *compiled, full int, d *Denial, limit string) (owner, *Denial) {
	f := c.owners[full]
	return f, &Denial{Budget: f.bs.name, Rule: st.ruleName[f.rule], Reason: d.Reason,
		Fingerprint: d.Fingerprint, Limit: limit, RetryAfter: d.RetryAfter}
}

// enqueue keeps c's place in its budgets' queues while it waits for what refused it, d of owner
// o (how): a claim waiting for health holds up those behind it in the budget whose health
// holds it back (budget.Hold; checked before the budgets' room, which records its own
// answers), and one not waiting yet joins the queues. It reports that c joined them now, or
// the index of the request whose queue it found full (-1: none).
func (c *claim) enqueue(o owner, d *Denial, how wake) (joined bool, full int) {
	why := budget.Denial{Index: c.index(o), Reason: d.Reason, Limit: d.Limit, RetryAfter: d.RetryAfter}
	if c.w.Waiting() {
		if how == wakeHealth {
			budget.Hold(c.w, c.reqs, &why)
		}
		return false, -1
	}
	if full = budget.Join(c.w, c.reqs, &why); full >= 0 {
		return false, full
	}
	return true, -1
}

// waitFor is how long a claim refused by d at now waits, unless woken, before it tries again:
// until its deadline (refused then), the bucket's exact RetryAfter (mayWait saw it fits the
// deadline), behind other waiters for the bucket no later than its RetryAfter, for health the
// next sample (sampled), a stale or missing one retried at the interval; and no later than the
// next lapse of a rule (lapse, zero: none).
func (e *Engine) waitFor(d *Denial, how wake, now, deadline, lapse time.Time) (wait time.Duration, sampled <-chan struct{}) {
	wait = deadline.Sub(now)
	switch how {
	case wakeAt:
		wait = d.RetryAfter
	case wakeTurn:
		if d.Reason == vocab.ReasonBudget && d.RetryAfter > 0 {
			// Refused for the bucket behind other waiters (budget.Denial.Queued): nothing
			// signals the bucket draining, and at RetryAfter it has room for this claim beside
			// theirs, should they still wait. Their leaving wakes it sooner.
			wait = min(wait, d.RetryAfter)
		}
	case wakeHealth:
		wait = min(wait, d.RetryAfter)
		if s := e.health.Load(); s != nil {
			sampled = s.Published()
		}
	}
	if !lapse.IsZero() {
		wait = min(wait, lapse.Sub(now))
	}
	return wait, sampled
}

// ErrClosed is the answer of a statement or batch that waited for capacity (max_wait) when its
// front end was closed (Close): it holds nothing, and nothing was sent.
var ErrClosed = errors.New("pgtraffic: the connector or pool is closed")

// Close answers the statements and batches waiting for capacity, and the jobs in Wait, with
// ErrClosed at once, rather than when room frees or their max_wait ends: their Pool or
// Connector is closing, and no connection will be theirs. From then on a statement that would
// wait is answered so without waiting. Statements admitted or running go on and are finished
// as before; one that finds room is still admitted (its front end refuses it when closed).
// Calls after the first do nothing.
func (e *Engine) Close() { e.closeOnce.Do(e.close) }

func (e *Engine) close() {
	e.closed.Store(true)
	close(e.done)
	e.reg.mu.Lock()
	budgets := make([]*budget.Budget, 0, len(e.reg.budgets))
	for _, b := range e.reg.budgets {
		budgets = append(budgets, b)
	}
	e.reg.mu.Unlock()
	for _, b := range budgets {
		b.WakeWaiters() // each tries again, and finds the engine closed
	}
}

// Closed reports whether Close was called.
func (e *Engine) Closed() bool { return e.closed.Load() }

// retry is a waiting claim's next try, at the time now; or ErrClosed when the engine was closed,
// or errRulesChanged when st is no longer the rule set in force: the claim was routed by
// replaced rules.
func (e *Engine) retry(st *compiled, c *claim) (now time.Time, o owner, d *Denial, how wake, err error) {
	if e.Closed() {
		return now, o, d, how, ErrClosed
	}
	if e.state.Load() != st {
		return now, o, d, how, errRulesChanged
	}
	now = e.now()
	o, d, how = e.try(st, c, now)
	return now, o, d, how, nil
}

// mayWait reports whether c, refused by d of owner o at now, may wait for what may lift it,
// how, before its deadline (claim.deadline) and ctx's. Only a budget with max_wait has a
// queue to wait in.
func (c *claim) mayWait(ctx context.Context, o owner, d *Denial, how wake, now, deadline time.Time) bool {
	switch {
	case how == wakeNever || c.patience == noWait:
		return false
	case o.bs.maxWait <= 0 || !now.Before(deadline):
		return false
	case how == wakeAt:
		// The bucket's RetryAfter is exact: a wait past the deadline would be refused anyway.
		at := now.Add(d.RetryAfter)
		return !at.After(deadline) && !ctxEndsBefore(ctx, at)
	}
	return true
}

// try checks c at now: health, zero limits, quarantines, then its budgets, taking its holds
// when c.take and all admit. On a refusal it returns the refusing owner, the denial and what
// may lift it; on admission, warnings of limits nearly full are noted.
func (e *Engine) try(st *compiled, c *claim, now time.Time) (owner, *Denial, wake) {
	if c.health {
		for _, o := range c.owners {
			if d := e.healthDenial(st, o.bs, o.rule, c.exec(o), now); d != nil {
				return o, d, wakeHealth
			}
		}
	}
	if c.closed {
		for _, o := range c.owners {
			if d := o.bs.closedDenial(st, o.rule, c.exec(o), now); d != nil {
				return o, d, wakeNever
			}
		}
	}
	if c.quarantine {
		if c.b == nil {
			if o, d := e.quarantineOf(st, c.rt, c.x, 0, now); d != nil {
				return o, d, wakeNever
			}
		} else {
			for i, rt := range c.b.routes {
				if rt == nil || !rt.quarantine {
					continue
				}
				if o, d := e.quarantineOf(st, rt, &c.b.Execs[i], i, now); d != nil {
					return o, d, wakeNever
				}
			}
		}
	}
	if len(c.reqs) == 0 {
		return owner{}, nil, wakeNever
	}
	var den *budget.Denial
	if c.take {
		c.warns, den = budget.Admit(now, c.reqs, c.warns[:0])
	} else {
		den = budget.Check(now, c.reqs)
	}
	if den != nil {
		o := c.owners[den.Index]
		d := o.bs.denial(st, o.rule, c.exec(o), den)
		switch {
		case den.Reason == vocab.ReasonPerQuery && !den.Queued:
			if c.probe(e, now) {
				return e.try(st, c, now) // once: a probe is not refused as too costly
			}
			return o, d, wakeNever // waiting cannot make a statement cheaper
		case den.Queued || den.Reason == vocab.ReasonConcurrency:
			return o, d, wakeTurn
		}
		return o, d, wakeAt
	}
	for _, w := range c.warns {
		o := c.owners[w.Index]
		e.thresholdWarn(c.exec(o), o.bs, st.ruleName[o.rule], w)
	}
	return owner{}, nil, wakeNever
}

// probe makes c, refused because its statement's predicted cost exceeds a limit that no wait
// lifts, its pattern's probe when the model hands one out (cost.Model.NeverFits): without one,
// a prediction that is too high (learned on a cold cache, or by a client measuring under its
// own load) would refuse the pattern for good, as nothing would run to correct it. The probe
// asks every budget for an unknown cost, which each reserves as for a cold start (cut to the
// room in its bucket) and trues up when it ends, and runs with the smallest such limit as its
// max_duration (probeBound), so that a pattern that really costs too much costs no more than
// its budgets admit. A batch and a job's Check never probe.
func (c *claim) probe(e *Engine, now time.Time) bool {
	x := c.x
	if c.b != nil || !c.take || x.probe || !e.model.NeverFits(now, x.Pattern.FingerprintID) {
		return false
	}
	for i := range c.reqs {
		c.reqs[i].Cost, c.reqs[i].Unknown = 0, true
	}
	x.probe, x.server = true, false // charged what it measures
	return true
}

// probeBound bounds admitted probe x, routed to rt, by the smallest limit of its enforce
// budgets (budget.MaxCost), unless a max_duration bounds it sooner: that limit is the probe's
// max_duration, so that one cut off there is cancelled, counted and reported as any statement
// past its budget's max_duration is (overrun.go).
func (x *Exec) probeBound(st *compiled, rt *route) {
	limit, by := math.Inf(1), owner{}
	for _, o := range rt.owners {
		if c := o.bs.b.MaxCost(); c < limit {
			limit, by = c, o
		}
	}
	if math.IsInf(limit, 1) {
		return // no limit left to bound it by (the rules changed while it waited)
	}
	if d := time.Duration(limit * 1e9); x.MaxDuration == 0 || d < x.MaxDuration {
		x.MaxDuration, x.bound, x.boundRule = d, by.bs, st.ruleName[by.rule]
		x.overrun = &OverrunCause{budget: by.bs.name, bound: d}
	}
}

// denial is bs's refusal of x, selected by rule, for den, its budget's denial.
func (bs *budgetState) denial(st *compiled, rule int, x *Exec, den *budget.Denial) *Denial {
	return &Denial{Budget: bs.name, Rule: st.ruleName[rule], Reason: den.Reason, Fingerprint: x.Pattern.Fingerprint,
		Limit: den.Limit, RetryAfter: den.RetryAfter}
}

// quarantineOf returns the owner and denial of the first of rt's enforce budgets that has x
// (statement i of its claim) quarantined at now, if any.
func (e *Engine) quarantineOf(st *compiled, rt *route, x *Exec, i int, now time.Time) (owner, *Denial) {
	for _, o := range rt.owners {
		if d := e.quarantineDenial(st, o.bs, o.rule, x, now); d != nil {
			o.stmt = i
			return o, d
		}
	}
	return owner{}, nil
}

// refuse records that d, of owner o's budget, refuses c at now (or kept it out until its
// caller's context ended): each of its statements is one block of the budget, marked so
// (Decision, Reason, Blocker), in its counts and in the recent refusals (as the observer
// counts each), and the refusal is logged once; a precheck's too, which refuses its statement
// or batch before its cost is known. A job's Check or Wait refuses no statement: nothing is
// recorded. A claim that waited leaves its queues first: the log's handler is the
// application's code, and the waiters behind it must not wait for it.
func (e *Engine) refuse(now time.Time, c *claim, o owner, d *Denial) {
	c.leave()
	if c.job {
		return
	}
	if c.b == nil {
		c.x.Decision, c.x.Reason, c.x.Blocker = DecisionBlock, d.Reason, d.Budget
		o.bs.b.Count(now, budget.Blocked, d.Reason)
		e.recordBlock(now, d, c.x.Pattern)
	} else {
		for i := range c.b.Execs {
			x := &c.b.Execs[i]
			x.Decision, x.Reason, x.Blocker = DecisionBlock, d.Reason, d.Budget
			o.bs.b.Count(now, budget.Blocked, d.Reason)
			e.recordBlock(now, d, x.Pattern)
		}
	}
	e.logDecision(d.Budget, DecisionBlock, d, c.exec(o).Pattern)
}
