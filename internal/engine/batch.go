package engine

import (
	"context"
	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"log/slog"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/budget"
)

// Batches. A pgx batch sends its statements in one round trip, so it is decided whole before
// anything is sent: each statement is identified, tagged, routed, guarded and costed as a
// statement would be, and the batch is admitted once, all or nothing, against the union of the
// budgets its statements select, each at the sum of the costs of the batch's statements that
// select it (a budget's per_query_limit judges each statement's cost, the limit of one
// statement, and its bucket the sum; its max_concurrent counts the batch as one statement in
// flight: it is one round trip on one connection). An admitted batch holds its slots until its
// results are closed.
//
// The statements of a batch run pipelined, so their times are not measured apart: a budget is
// charged the predictions of the batch's statements it holds when all of them are on the
// server's clock, else the batch's time (whose share of each pattern the server can report is
// kept for its report to true up, as a statement's charge on the client's clock is), and the
// cost model trains only on a batch whose statements are all one pattern (sqlc's
// :batchexec), from their mean. The batch runs under the smallest max_duration of its
// statements' enforce budgets (Batch.Deadline); when it is cancelled, each statement with a
// bound counts as its budget's max_duration block, and, in a batch of one pattern, a strike
// where its budget has a quarantine. A batch does not take part in the unknown-cost
// reservation of single statements: its statements are predicted from what is known.

// Batch is one batch's ticket, from BeginBatch to Finish. Execs are its statements in order:
// Execs[i].Result is what was decided about statement i, read-only for the front end until the
// ticket's next BeginBatch. The rest is the engine's.
//
// The lifecycle is an Exec's: BeginBatch decides; on an error nothing is held and nothing may
// be sent; on nil the front end sends the batch and calls Finish exactly once when its results
// are closed, on every path. A Batch is not safe for concurrent use; the zero value is ready
// for BeginBatch, and a Batch may be reused once finished.
type Batch struct {
	Execs []Exec
	batchWork
}

// batchWork is a Batch's private part: the batch's clock and its admission.
type batchWork struct {
	e *Engine
	// again is the call that decides the batch again, as the same batch, as work.again is a
	// statement's: BeginBatchTaken after ErrNeedConn or Acquired's ErrDecideAgain,
	// BeginBatchBeforeConn after ErrWaitBeforeConn; onHeld: none.
	again connState
	start time.Time // when the batch was admitted; zero when nothing read the clock
	// arrived is when the engine began deciding the batch (Exec.arrived); zero until then.
	arrived time.Time
	// holds are the batch's requests, one per budget and per-tag value of the union: the
	// enforce budgets' (admitted together) and then the warn budgets' that had room. owners[i]
	// says whose holds[i] is.
	holds  []budget.Request
	owners []owner
	held   int // holds[:held] are taken from their budgets
	// chargers are the statements charged to each hold: one per statement and request of its
	// route, in statement order (a hold is found by its budget and key: holds are reordered).
	chargers []charger
	// later: the batch has no connection yet (BeginBatchBeforeConn): its enforce holds are
	// pending until Acquired (budget.Request.Pending).
	later bool
	// taken: the batch is decided on a connection the pool lent it alone (BeginBatchTaken),
	// which it gives back rather than wait for health there (ErrWaitBeforeConn).
	taken bool
	// st is the rule set that admitted a batch before its connection, which Acquired admits it
	// under again when its slots were overtaken meanwhile; nil otherwise, and once Acquired or
	// Abandon ran, so that a Batch kept for reuse pins no old rules.
	st     *compiled
	warns  []budget.Warning
	claim  claim         // its admission (admission.go)
	waiter budget.Waiter // its place in the budgets' queues while it waits
	texts  []*textEntry  // each statement's text cache entry, while BeginBatch runs
	routes []*route      // each statement's route (nil: not routed), while BeginBatch runs
	// ctxs are the contexts the observer's Started returned for the statements it records (nil
	// for the others), handed back to its Finished: a batch's statements end in one Finish, so
	// the batch keeps them, as a front end keeps a statement's (see Observer).
	ctxs []context.Context
}

// BeginBatch decides the batch of queries (with their args: args[i] are query i's, as Begin
// takes them; args may be shorter than queries for statements without arguments) into b.
// conn is the connection the batch will be sent on, idle, used for nothing but EXPLAIN while
// BeginBatch runs; nil means no EXPLAIN.
//
// It returns nil when the batch may be sent (then b must be finished with Finish), a *Denial
// when any statement is refused by a guard or the union of their budgets does not admit the
// batch (nothing may be sent: every statement's Result is the block), or ctx's error when ctx
// ended while waiting for capacity. On an error nothing is held and b needs no Finish; a panic
// in code BeginBatch calls (an observer, a logger) gives back what it took.
func (e *Engine) BeginBatch(ctx context.Context, b *Batch, conn Conn, queries []string, args [][]any) error {
	return e.beginBatch(ctx, b, conn, onHeld, queries, args)
}

// BeginBatchBeforeConn is BeginBatch for a batch that has no connection yet, as
// BeginBeforeConn is Begin for a statement: when a statement's cost needs an EXPLAIN it takes
// nothing and returns ErrNeedConn; once it admits the batch (its slots pending until it has its
// connection) the front end acquires the connection and calls [Batch.Acquired], or
// [Batch.Abandon] if it cannot or Acquired refuses the batch.
func (e *Engine) BeginBatchBeforeConn(ctx context.Context, b *Batch, queries []string, args [][]any) error {
	return e.beginBatch(ctx, b, nil, beforeConn, queries, args)
}

// BeginBatchTaken is BeginBatch for a batch of the pool on conn, a connection taken from the
// pool for it alone before it was admitted, as BeginTaken is Begin for a statement: held back
// by a health threshold, it returns ErrWaitBeforeConn rather than wait holding conn.
func (e *Engine) BeginBatchTaken(ctx context.Context, b *Batch, conn Conn, queries []string, args [][]any) error {
	return e.beginBatch(ctx, b, conn, onTaken, queries, args)
}

// beginBatch is BeginBatch (at onHeld), BeginBatchBeforeConn (beforeConn) and BeginBatchTaken
// (onTaken).
func (e *Engine) beginBatch(ctx context.Context, b *Batch, conn Conn, at connState, queries []string,
	args [][]any) error {
	if !resumes(b.again, at) {
		for i := range b.Execs {
			b.Execs[i].spanned = nil // a new batch: nothing of an earlier one's goes on
		}
	}
	b.reset(e, len(queries))
	later := at == beforeConn
	b.later, b.taken = later, at == onTaken
	begun := false
	defer func() {
		if !begun {
			b.unwind()
		}
	}()
	// Every statement is identified first, so that a refusal reaches each one's observer.
	for i, q := range queries {
		x := &b.Execs[i]
		p, text := e.texts.get(q, e.patterns)
		x.reset(e, p)
		x.later, x.InBatch = later, true
		b.texts = append(b.texts, text)
		if e.obs != nil {
			x.Wants = e.obs.Wants() | x.resumedWants()
			x.Observed, x.Resumed = x.Wants&WantSpans != 0, x.spanned != nil
		}
	}
	st := e.state.Load()
	debug := e.log.Enabled(ctx, slog.LevelDebug)
	if !resumes(b.again, at) {
		b.waiter.Forget() // a new batch: at the back of any queue it joins
		b.arrived = time.Time{}
	}
	b.again = onHeld
	err := e.decideBatch(ctx, st, b, conn, queries, args, debug)
	for err == errRulesChanged {
		// The rules were replaced while the batch waited for room: routed and decided again
		// under the rules in force, now, its max_wait still counted from its arrival.
		b.undecide()
		b.start = time.Time{}
		st = e.state.Load()
		err = e.decideBatch(ctx, st, b, conn, queries, args, debug)
	}
	for i, rt := range b.routes {
		if rt != nil { // routed: its tags are merged
			e.warnGuards(st, &b.Execs[i], err)
		}
	}
	clear(b.texts) // pin no cache entry until the next batch
	if err != nil {
		if err != ErrNeedConn && err != ErrWaitBeforeConn { // else nothing was decided: the front end decides it again
			b.refused(ctx, err)
		}
		return err
	}
	for i := range b.Execs {
		x := &b.Execs[i]
		if rt := b.routes[i]; rt != nil {
			x.start = b.start // max_duration runs from the admission, as the batch's time does
			if rt.bound > 0 || len(rt.warnBounds) > 0 {
				x.bind(st, rt)
			}
			if rt.quarantine {
				x.noteQuarantinable(st, rt)
			}
		}
		if x.Observed {
			b.ctxs[i] = e.obs.Started(x.spanContext(ctx), x)
		}
	}
	if !later {
		b.countDecisions(st)
		e.inFlight.Add(int64(len(b.Execs)))
	} else {
		e.pending.Add(int64(len(b.Execs))) // in flight from Acquired
	}
	begun = true
	return nil
}

// decideBatch routes, guards and costs each statement of b under st, then admits the batch's
// union of budgets (admitBatch). ErrNeedConn: a statement's cost needs an EXPLAIN on the
// connection, which b has not, and nothing that refuses b whatever it costs did
// (precheckBatch); errRulesChanged: st was replaced while b waited for room.
func (e *Engine) decideBatch(ctx context.Context, st *compiled, b *Batch, conn Conn, queries []string,
	args [][]any, debug bool) error {
	needConn := false
	for i, q := range queries {
		x := &b.Execs[i]
		if st.empty && x.Wants == 0 && !debug {
			continue // as Begin: nothing reads this statement
		}
		if b.start.IsZero() {
			b.start = e.now()
		}
		if b.arrived.IsZero() {
			b.arrived = b.start // max_wait counts from here, also when decided again
		}
		x.start, x.arrived = b.start, b.arrived
		rt := e.routeStatement(ctx, st, x, b.texts[i], debug, q)
		b.routes[i] = rt
		if st.empty {
			continue
		}
		var qargs []any
		if i < len(args) {
			qargs = args[i]
		}
		switch err := e.batchStatement(ctx, st, b, i, rt, conn, q, qargs); err {
		case nil:
		case ErrNeedConn:
			needConn = true // the others are routed too: what refuses the batch whatever it costs is decided first
		default:
			return err
		}
	}
	if needConn {
		return e.precheckBatch(ctx, st, b)
	}
	if len(b.holds) > 0 {
		if err := e.admitBatch(ctx, st, b); err != nil {
			return err
		}
		// An EXPLAIN or a wait for capacity is not the batch's cost: measure from here.
		b.start = e.now()
	}
	return nil
}

// undecide clears what a decision of b under rules since replaced set (errRulesChanged): its
// routes, its union of budgets and each statement's decision. Nothing is held.
func (b *Batch) undecide() {
	b.holds, b.owners, b.held, b.chargers = b.holds[:0], b.owners[:0], 0, b.chargers[:0]
	clear(b.routes)
	for i := range b.Execs {
		b.Execs[i].undecide()
	}
}

// reset readies b for a batch of n statements, keeping its storage.
func (b *Batch) reset(e *Engine, n int) {
	if cap(b.Execs) < n {
		b.Execs = append(b.Execs[:cap(b.Execs)], make([]Exec, n-cap(b.Execs))...)
	}
	b.Execs = b.Execs[:n]
	b.e, b.start, b.held, b.st = e, time.Time{}, 0, nil
	b.holds, b.owners, b.texts, b.chargers = b.holds[:0], b.owners[:0], b.texts[:0], b.chargers[:0]
	b.routes = append(b.routes[:0], make([]*route, n)...)
	b.ctxs = append(b.ctxs[:0], make([]context.Context, n)...)
}

// batchStatement guards and costs statement i of b, routed to rt, and adds its budgets to b's
// union: its enforce budgets' requests to b.holds at its predicted cost. Its warn budgets are
// added too, admitted after the enforce ones (admitBatch).
func (e *Engine) batchStatement(ctx context.Context, st *compiled, b *Batch, i int, rt *route, conn Conn,
	query string, args []any) error {
	x := &b.Execs[i]
	p := x.Pattern
	if x.guarded = (p.UnsafeWrite || p.Truncate) && !guardBypassed(ctx); x.guarded {
		if err := e.guard(st, x, modeEnforce); err != nil {
			return err
		}
	}
	if len(rt.budgets) == 0 {
		return nil
	}
	x.Budgets = rt.names
	var later bool
	if rt.needCost {
		var err error
		if _, later, err = e.predict(ctx, st, x, rt, &call{conn: conn, query: query, args: args}); err != nil {
			return err
		}
		x.Costed = !later
	}
	for j, bi := range rt.budgets {
		bs := st.budgets[bi]
		b.add(bs, rt.ruleOf[j], i, rt.keys[j], x.Predicted)
	}
	if later {
		return ErrNeedConn // its budgets are in the union all the same, for precheckBatch
	}
	return nil
}

// add adds cost to the batch's request of bs for key, making it for statement i (selected by
// rule) if it is the first of the batch to select it.
func (b *Batch) add(bs *budgetState, rule, i int, key string, cost float64) {
	b.chargers = append(b.chargers, charger{b: bs.b, key: key, stmt: i})
	for j, r := range b.holds {
		if r.Budget == bs.b && r.Key == key {
			b.holds[j].Cost += cost
			b.holds[j].Largest = max(r.Largest, cost)
			return
		}
	}
	b.holds = append(b.holds, budget.Request{Budget: bs.b, Key: key, Cost: cost, Largest: cost})
	b.owners = append(b.owners, owner{bs: bs, rule: rule, stmt: i})
}

// enforceClaim readies b's claim to the enforce budgets of its union, whose n requests it puts
// first in b.holds: Admit takes them as one, pending while b has no connection (Acquired).
func (b *Batch) enforceClaim() (c *claim, n int) {
	for j := range b.owners {
		if b.owners[j].bs.mode == modeEnforce {
			b.holds[n], b.holds[j] = b.holds[j], b.holds[n]
			b.owners[n], b.owners[j] = b.owners[j], b.owners[n]
			n++
		}
	}
	quarantine := false
	for _, rt := range b.routes {
		quarantine = quarantine || rt != nil && rt.quarantine
	}
	for j := range b.holds[:n] {
		b.holds[j].Pending = b.later
	}
	c = &b.claim
	*c = claim{b: b, reqs: b.holds[:n], owners: b.owners[:n], health: true, closed: true, quarantine: quarantine,
		take: true, lent: b.taken, patience: maxWait, w: &b.waiter, warns: b.warns}
	return c, n
}

// precheckBatch decides b, which has no connection and a statement whose cost needs an EXPLAIN
// on one, by what refuses it whatever it costs, as precheck does a statement: the health
// thresholds, zero limits and quarantines of its enforce budgets, waiting in their queues with
// its requests checked, not taken, as of an unknown cost. It returns their refusal, ctx's
// error, or ErrNeedConn.
func (e *Engine) precheckBatch(ctx context.Context, st *compiled, b *Batch) error {
	c, _ := b.enforceClaim()
	reqs := make([]budget.Request, len(c.reqs)) // b's own are priced once it has a connection
	for j, r := range c.reqs {
		r.Unknown = true
		reqs[j] = r
	}
	c.reqs, c.take = reqs, false
	if _, err := e.admit(ctx, st, c, b.start, b.arrived); err != nil {
		return err
	}
	b.again = onTaken // decided on its connection as the same batch
	b.waiter.Arrive() // should it wait there or before a connection, in its place of arrival
	return ErrNeedConn
}

// admitBatch admits b's union: its enforce requests together, all or nothing, as a statement's
// are (admit); then its warn requests one by one, as warnBudgets does. On success b.holds are
// the batch's holds.
func (e *Engine) admitBatch(ctx context.Context, st *compiled, b *Batch) error {
	c, n := b.enforceClaim()
	_, err := e.admit(ctx, st, c, b.start, b.arrived)
	b.warns = c.warns
	if err != nil {
		if err == ErrWaitBeforeConn {
			b.again = beforeConn
		}
		return err
	}
	b.held = n
	if b.later {
		b.st = st // for Acquired, should its slots be overtaken before it has its connection
	}
	// Then each warn budget on its own, as warnBudgets does: one that would block warns, and
	// the batch runs without a hold in it; one that would make it wait (max_wait) holds it as a
	// would-be waiter. The ones admitted are kept after the enforce ones.
	now := e.now()
	for k := n; k < len(b.holds); k++ {
		o := b.owners[k]
		x := &b.Execs[o.stmt]
		if d := e.refusedWhatever(st, o.bs, o.rule, x, now); d != nil {
			b.warnCharged(e, &b.holds[k], o.bs.name, d)
			continue
		}
		ws, den := budget.Admit(now, b.holds[k:k+1], b.warns[:0])
		b.warns = ws
		if den != nil && !budget.TakeWaiter(now, &b.holds[k], den, o.bs.maxWait) {
			b.warnCharged(e, &b.holds[k], o.bs.name, o.bs.denial(st, o.rule, x, den))
			continue
		}
		// As admitted: what it reserved, and when, for its release.
		b.holds[b.held], b.owners[b.held] = b.holds[k], o
		b.held++
		for _, w := range ws {
			e.thresholdWarn(x, o.bs, st.ruleName[o.rule], w)
		}
	}
	b.holds, b.owners = b.holds[:b.held], b.owners[:b.held]
	return nil
}

// refused marks every statement of b blocked by err (a guard's or a budget's denial, or ctx's
// error while waiting) and tells the observer of each. Nothing is held.
func (b *Batch) refused(ctx context.Context, err error) {
	b.holds, b.owners, b.held = b.holds[:0], b.owners[:0], 0
	clear(b.texts)
	reason, blocker := "", ""
	d, denied := err.(*Denial)
	if denied {
		reason, blocker = d.Reason, d.Budget
	}
	e := b.e
	for i := range b.Execs {
		x := &b.Execs[i]
		if denied && reason == vocab.ReasonGuard && x.Decision != DecisionBlock {
			// The guard recorded the statement it refused; the others are refused with it, each
			// one refusal, as a budget's refusal of a batch records each (refuse).
			e.recordBlock(e.now(), d, x.Pattern)
		}
		if denied || x.Decision != DecisionBlock { // else refuse marked it, its context ended while it waited
			x.Decision, x.Reason, x.Blocker = DecisionBlock, reason, blocker
		}
		if x.start.IsZero() {
			x.start = e.now() // a statement after the one a guard refused: its span starts now
			x.arrived = x.start
		}
		if e.obs != nil {
			e.obs.Blocked(x.spanContext(ctx), x, err)
		}
	}
}

// unwind gives back what a BeginBatch that did not succeed may hold: after a denial nothing;
// after a panic, the holds taken.
func (b *Batch) unwind() {
	if b.held > 0 {
		giveBack(b.e.now(), b.holds[:b.held])
	}
	b.holds, b.owners, b.held = b.holds[:0], b.owners[:0], 0
	clear(b.texts)
	clear(b.ctxs)
}

// Finish ends the batch that b's BeginBatch admitted, once its results are closed: it
// releases the batch's holds, trues its budgets' debt up to the batch's cost and tells the
// observer of each statement. errs[i] is statement i's outcome (nil on success); errs may be
// nil (all succeeded) or shorter than the batch (the rest succeeded). Call it exactly once per
// successful BeginBatch, on every path (defer it).
func (b *Batch) Finish(ctx context.Context, errs []error) {
	e := b.e
	e.inFlight.Add(-int64(len(b.Execs)))
	e.ends.ended()
	if b.start.IsZero() {
		return // no rules were in force and telemetry was idle: nothing to account
	}
	now := e.now()
	took := now.Sub(b.start)
	// As a statement's (Exec.Finish): each hold is charged the predictions of its statements when
	// every one is on the server's clock (at least the batch's time when it failed), else the
	// batch's time less the network's round trip, kept for the server's reports to true up when
	// the batch completed.
	measured := lessFloor(took, e.floor.Load()).Seconds()
	failed := firstError(errs) != nil
	keep := !failed && e.clientCharges.wanted(now)
	one := b.onePattern()
	if one && len(b.Execs[0].quarantinable) > 0 && b.Execs[0].cutOff(firstError(errs)) {
		// The batch's statements are not timed apart, so only a cancellation strikes (a
		// per_query_limit strike would judge each statement by the whole batch's time), and
		// only in a batch of one pattern: the server sends a pipeline's results at its end,
		// so every statement's result reports the cancellation, those that had completed
		// included, and which one was running is unknown. Quarantining the wrong one would
		// refuse a cheap statement everywhere; a batch of several patterns strikes nobody
		// instead. Before its slots go back, as a statement's (Exec.Finish).
		e.strikes(&b.Execs[0], true, took, 0, now)
	}
	for i := range b.holds[:b.held] {
		r := &b.holds[i]
		if b.serverClock(r) {
			charge := r.Cost
			if failed {
				// The server reports no statement that failed or was cancelled, nor, in a
				// pipeline, which of the batch's statements ran: as a statement's, the charge is
				// what the batch took on the client's clock, at least the predictions.
				charge = max(r.Cost, measured)
			}
			budget.Release(now, r, charge)
			continue
		}
		budget.Release(now, r, measured)
		if keep {
			b.keepClientCharge(b.holds[i:i+1], measured, now)
		}
	}
	b.holds, b.owners, b.held, b.chargers = b.holds[:0], b.owners[:0], 0, b.chargers[:0]
	if x := &b.Execs[0]; one && !failed && x.Costed && ctx.Err() == nil {
		// Its statements' mean is their pattern's: learnt as a statement's time is, counting
		// each of them (a pattern sqlc only ever sends in batches is priced like another).
		n := len(b.Execs)
		e.model.Observe(x.Pattern.FingerprintID, x.Pattern.Normalized, x.taught(), measured/float64(n),
			x.explained, uint64(n))
	}
	for i := range b.Execs {
		x := &b.Execs[i]
		var err error
		if i < len(errs) {
			err = errs[i]
		}
		if x.bound != nil || len(x.warnBounds) > 0 {
			e.overran(x, x.cutOff(err), took, now)
		}
		if x.Wants&(WantSpans|WantDuration) != 0 {
			e.obs.Finished(b.StatementContext(ctx, i), x, err, took)
		}
	}
	b.finished(ctx, firstError(errs), took)
	clear(b.ctxs) // pin no caller's context until the next batch
}

// onePattern reports whether the batch's statements, at least one, are all of one pattern.
func (b *Batch) onePattern() bool {
	if len(b.Execs) == 0 || b.Execs[0].Pattern == nil {
		return false
	}
	fp := b.Execs[0].Pattern.FingerprintID
	for i := range b.Execs[1:] {
		if p := b.Execs[i+1].Pattern; p == nil || p.FingerprintID != fp {
			return false
		}
	}
	return true
}

// charger is a statement of a batch (its index) charged to the batch's hold of budget b and key.
type charger struct {
	b    *budget.Budget
	key  string
	stmt int
}

// warnCharged warns with d about each statement of b charged to hold r of the warn budget
// name: enforce would refuse the batch, and each of them with it, one decision a statement (as
// refused counts them).
func (b *Batch) warnCharged(e *Engine, r *budget.Request, name string, d *Denial) {
	for i := range b.chargers {
		if c := &b.chargers[i]; c.charges(r) {
			b.Execs[c.stmt].warnBudget(e, name, d)
		}
	}
}

// charges reports whether c charges hold r.
func (c *charger) charges(r *budget.Request) bool { return c.b == r.Budget && c.key == r.Key }

// serverClock reports whether every statement of b charged to hold r is on the server's clock:
// then r is charged their predictions. A statement no budget of r selects has no say.
func (b *Batch) serverClock(r *budget.Request) bool {
	for i := range b.chargers {
		if c := &b.chargers[i]; c.charges(r) && !b.Execs[c.stmt].server {
			return false
		}
	}
	return true
}

// keepClientCharge keeps charged, what the one hold of held was charged on the client's clock,
// for the server's reports of its statements' patterns to true up (clientCharges), as Finish
// keeps a statement's: split evenly between the statements charged to it, the share of each
// pattern the server can report is trued up to its statements' count times the pattern's mean
// on the server. The share of a pattern it cannot report keeps the client's measurement. The
// count is a map only here: a batch's charges are kept only until its patterns' first reports.
func (b *Batch) keepClientCharge(held []budget.Request, charged float64, now time.Time) {
	n, stmts := 0, map[uint64]int{}
	for i := range b.chargers {
		if c := &b.chargers[i]; c.charges(&held[0]) {
			n++
			if x := &b.Execs[c.stmt]; x.identified {
				stmts[x.Pattern.FingerprintID]++
			}
		}
	}
	for fp, k := range stmts {
		b.e.clientCharges.add(fp, held, charged*float64(k)/float64(n), k, now)
	}
}

// finished tells the observer that b ended with err after d, when its first statement wants
// the duration metric.
func (b *Batch) finished(ctx context.Context, err error, d time.Duration) {
	if len(b.Execs) > 0 && b.Execs[0].Wants&WantDuration != 0 {
		b.e.obs.BatchFinished(ctx, b, err, d)
	}
}

// firstError is the first non-nil error of errs, or nil.
func firstError(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// StatementContext is the context of statement i of the admitted batch, as Begin returns a
// statement's: the one the observer's Started returned for it (carrying its span), or ctx, the
// batch's. Its observer gets it back at its end.
func (b *Batch) StatementContext(ctx context.Context, i int) context.Context {
	if c := b.ctxs[i]; c != nil {
		return c
	}
	return ctx
}

// Acquired tells b, admitted by BeginBatchBeforeConn, that its connection is acquired, as
// Exec.Acquired does a statement: its clock restarts, its pending slots become running ones,
// and when they were overtaken meanwhile it gives back its enforce budgets' holds and is
// admitted again on its connection, possibly waiting up to max_wait (for capacity: not for
// health, ErrWaitBeforeConn). It returns nil when b may be sent, else the refusal (a *Denial,
// counted and recorded for each of its statements, ctx's error, or ErrDecideAgain or
// ErrWaitBeforeConn as Exec.Acquired returns them): b then holds nothing, and the front end
// calls Abandon and gives the connection back (deciding the batch again before a connection on
// ErrWaitBeforeConn), or on ErrDecideAgain decides the batch again on it.
func (b *Batch) Acquired(ctx context.Context) error {
	b.later = false
	for i := range b.Execs {
		b.Execs[i].later = false
	}
	b.e.connected(len(b.Execs))
	if b.start.IsZero() {
		return nil
	}
	st := b.st
	b.st = nil
	b.start = b.e.now()
	b.arrived = b.start // as Exec.Acquired: Held counts only a wait on the connection
	if st != nil && st != b.e.state.Load() {
		// The rules were replaced while b waited for its connection: it gives back what it
		// holds and is decided again on its connection, as Exec.Acquired does a statement.
		giveBack(b.start, b.holds[:b.held])
		b.holds, b.owners, b.held = b.holds[:0], b.owners[:0], 0
		b.again = onTaken
		b.countDecisions(nil) // the decision made again on its connection counts
		return ErrDecideAgain
	}
	for i := range b.holds[:b.held] {
		if !budget.Connect(b.start, &b.holds[i]) {
			if err := b.admitAgain(ctx, st, i); err != nil {
				b.countDecisions(nil) // its refusal counted (admitAgain), or the decision made again
				return err
			}
			break
		}
	}
	for i := range b.Execs {
		if x := &b.Execs[i]; !x.start.IsZero() {
			x.start, x.arrived = b.start, b.arrived
		}
	}
	b.countDecisions(st)
	return nil
}

// countDecisions counts the decisions of b's statements under st, as Exec.countLater does a
// statement's: at BeginBatch, or for a batch admitted before its connection once they are final
// (Acquired, Abandon); st nil counts none. Then their routes go: no cached route stays pinned
// until the next batch.
func (b *Batch) countDecisions(st *compiled) {
	for i, rt := range b.routes {
		if x := &b.Execs[i]; st != nil && rt != nil && len(x.Budgets) > 0 {
			b.e.decisions(st, x, rt)
		}
	}
	clear(b.routes)
}

// admitAgain admits b, whose hold gone was overtaken (budget.Connect gave it back), again under
// st as a batch on its connection, as Exec.admitAgain does a statement: the other enforce holds
// go back at no cost and the same requests, no longer pending, are asked again through admit
// with b's claim. On a refusal its warn budgets' holds go back too, every statement is marked
// blocked, and the observer counts a block for each, as the budget does.
func (b *Batch) admitAgain(ctx context.Context, st *compiled, gone int) error {
	e, c := b.e, &b.claim
	n := len(c.reqs) // b.holds[:n] are the enforce budgets' (admitBatch), b.holds[n:b.held] the warn budgets'
	for i := range b.holds[:n] {
		if i != gone {
			budget.Return(b.start, &b.holds[i]) // never ran
		}
		b.holds[i].Pending = false
	}
	c.lent = true
	again, err := e.readmit(ctx, st, c, &b.start, &b.arrived)
	b.warns = c.warns
	b.again = decidedAgainAt(again, err, b.again)
	if err != nil {
		giveBack(b.start, b.holds[n:b.held])
		b.holds, b.owners, b.held = b.holds[:0], b.owners[:0], 0
		if decidedAgain(err) {
			return err // nothing refused it: it is decided again
		}
		d, denied := err.(*Denial)
		for i := range b.Execs {
			x := &b.Execs[i]
			x.Decision, x.Reason, x.Blocker = DecisionBlock, "", "" // as refused marks them
			if denied {
				x.Reason, x.Blocker = d.Reason, d.Budget
				if x.Wants&WantDecisions != 0 {
					e.obs.Decision(d.Budget, DecisionBlock, d.Reason)
				}
			}
		}
	}
	return err
}

// EndUndecided ends b, which BeginBatchBeforeConn answered ErrNeedConn, when the connection
// its EXPLAINs need could not be taken (err, the pool's error), as Exec.EndUndecided: each
// statement's observer is told that it ended with err before it was decided.
func (b *Batch) EndUndecided(ctx context.Context, err error) { b.refused(ctx, err) }

// Abandon ends b, admitted by BeginBatchBeforeConn, when no connection could be acquired for
// it or Acquired refused it: as Exec.Abandon, whatever holds it still has go back at no cost,
// nothing is learned, and each statement's observer is told that it ended with err. Call it
// instead of Finish. Abandoned with Acquired's ErrDecideAgain or ErrWaitBeforeConn, b does not
// end, as Exec.Abandon says: its next decision continues each statement's span.
func (b *Batch) Abandon(ctx context.Context, err error) {
	e := b.e
	e.leave(len(b.Execs), b.later)
	b.countDecisions(b.st) // admitted, its connection never came: those decisions stand
	b.st = nil
	if b.start.IsZero() {
		return
	}
	now := e.now()
	giveBack(now, b.holds[:b.held])
	b.holds, b.owners, b.held = b.holds[:0], b.owners[:0], 0
	if decidedAgain(err) {
		b.again = decidedAgainAt(false, err, b.again)
		for i := range b.Execs {
			if c := b.ctxs[i]; c != nil {
				b.Execs[i].keepSpan(c)
			}
		}
		clear(b.ctxs)
		return
	}
	for i := range b.Execs {
		x := &b.Execs[i]
		if x.Wants&(WantSpans|WantDuration) != 0 {
			e.obs.Finished(b.StatementContext(ctx, i), x, err, now.Sub(b.start))
		}
	}
	b.finished(ctx, err, now.Sub(b.start))
	clear(b.ctxs)
}

// Deadline is when the admitted batch's smallest max_duration ends, counted from its admission;
// ok is false when none of its enforce budgets has one. The front end runs the batch, its
// results included, under a context with this deadline and ErrOverrun as its cause, as it runs
// a statement (Result.MaxDuration).
func (b *Batch) Deadline() (deadline time.Time, cause error, ok bool) {
	for i := range b.Execs {
		if d, c, has := b.Execs[i].Deadline(); has && (!ok || d.Before(deadline)) {
			deadline, cause, ok = d, c, true
		}
	}
	return deadline, cause, ok
}
