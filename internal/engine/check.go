package engine

import (
	"context"
	"math/rand/v2"

	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/health"
	"github.com/pgtraffic/pgtraffic/internal/pattern"
	"github.com/pgtraffic/pgtraffic/tagging"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// checkPattern stands for "the job's next statement" in Check's denials.
var checkPattern = &pattern.Pattern{Fingerprint: "", Kind: vocab.KindOther}

// nominalCost is the least cost Check asks a bucket for: one small statement (1 ms), until the
// budget's statements have a recent cost (budget.RecentCost). A batch job that checks before a
// chunk wants to know whether its next statement would be admitted.
const nominalCost = 0.001

// Check reports whether a statement carrying ctx's tags would be admitted now by the enforce
// budgets its tags select: health thresholds, zero limits, concurrency and bucket room, and
// whether others wait for them first. It routes like a statement (built-in and context tags;
// the statement's own tags are unknown) and takes nothing. It returns nil or a *Denial; once e
// is closed, ErrClosed: no statement of its front end will run.
func (e *Engine) Check(ctx context.Context) error { return e.check(ctx, noWait) }

// check is Check, waiting as p allows: not at all (noWait), or in the budgets' queues for its
// turn (turn: Wait). When the rules it waited under are replaced, it checks again under the
// new ones at once, in its place of arrival, its max_wait still counted from then, as a
// statement does.
func (e *Engine) check(ctx context.Context, p patience) error {
	if e.Closed() {
		return ErrClosed
	}
	// As a pool statement before its connection (later), which in_flight thresholds hold to the
	// statements admitted and waiting for theirs too (healthDenial).
	arrived := e.now()
	x := &Exec{Result: Result{Pattern: checkPattern}, work: work{e: e, start: arrived, later: true}}
	x.s.waiter.Job = true // it holds nothing while it waits: no queue's bound counts it
	x.Tags = e.mergeTags(tagging.From(ctx), nil, nil, "")
	for {
		st := e.state.Load()
		if st.rules == nil {
			return nil
		}
		rt := &x.s.rt
		st.route(x.Tags, rt, nil, x.start)
		// The nominal statement costs what the budget's recent statements cost, the larger
		// ones at once (at least nominalCost), or the budget's per_query_limit where that is
		// smaller: Check asks about room for a statement like the large ones the budget runs (a
		// job's chunks, whose text it does not know), so that Wait does not pass while the chunk
		// would be refused for want of bucket room. It asks as a statement without a
		// connection yet (budget.Request.Pending), as the pgx-native pool decides one: every
		// slot in flight counts, those of pool statements still waiting for a connection
		// included, and every statement waiting for the budget comes first. (As a connected
		// request it would pass both, and say yes to a job whose next pool statement is
		// refused.)
		reqs := make([]budget.Request, len(rt.reqs))
		for i, r := range rt.reqs {
			r.Cost, r.Pending = max(nominalCost, r.Budget.RecentCost()), true
			if pq := rt.owners[i].bs.perQuery.Seconds(); pq > 0 {
				r.Cost = min(r.Cost, pq)
			}
			reqs[i] = r
		}
		c := &claim{x: x, rt: rt, reqs: reqs, owners: rt.owners, health: rt.health, closed: rt.closed,
			patience: p, w: &x.s.waiter, job: true}
		if _, err := e.admit(ctx, st, c, x.start, arrived); err != errRulesChanged {
			return err
		}
		x.start = e.now()
	}
}

// Wait blocks until Check passes, ctx ends (then it returns ctx's error, at once for a ctx
// ended before the call, room or not) or e is closed (then it returns ErrClosed, at once if
// it was waiting: Close). Under a budget that lets statements
// wait (max_wait) it waits its turn in the budget's queue, as a statement does, in arrival
// order and for as long as ctx allows, and passes when it is first with room: it takes
// nothing, so the waiter behind it is told to try at once. A job that waits before each
// chunk is thus never passed over for ever by statements that keep arriving (it would be if
// it passed only once the queue was empty). A full queue, and a budget without max_wait, it
// checks again about the denial's retry hint later, with jitter, growing with each attempt,
// so that many waiting jobs do not all rush in the moment a metric drops; and at once when the
// rules are replaced (a reload that lifts a limit, or reopens a budget closed by a zero limit,
// whose refusal gives no retry hint), as the statements waiting under max_wait are decided again.
func (e *Engine) Wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err // as pgxpool's Acquire answers a context already ended, room or not
	}
	for attempt := 0; ; attempt++ {
		replaced := e.replaced() // before the check: a reload after it wakes the wait below
		err := e.check(ctx, turn)
		// Held back by an in_flight threshold (the engine's own count, which no sample
		// reports), it also watches the ends of the engine's statements, as a statement waiting
		// for health does (await): the first end after the check wakes it.
		var ended <-chan struct{}
		if e.inFlightHeld(err) {
			e.ends.watch()
			ended = e.ends.next()
			err = e.check(ctx, turn) // a statement that ended since the first check woke nobody
		}
		if err, done := e.waitOnce(ctx, err, attempt, replaced, ended); done {
			return err
		}
	}
}

// waitOnce is one of Wait's waits after a check that answered err, watching ended (nil: no
// statement end) as well, which it stops watching: done reports that Wait returns err.
func (e *Engine) waitOnce(ctx context.Context, err error, attempt int, replaced, ended <-chan struct{}) (_ error, done bool) {
	if ended != nil {
		defer e.ends.unwatch()
	}
	switch {
	case err == nil || err == ErrClosed:
		return err, true
	case ctx.Err() != nil:
		return ctx.Err(), true
	}
	base := e.state.Load().healthInterval
	if d, ok := err.(*Denial); ok && d.RetryAfter > 0 && d.RetryAfter < base {
		base = d.RetryAfter
	}
	select {
	case <-ctx.Done():
		return ctx.Err(), true
	case <-e.done:
		return ErrClosed, true
	case <-replaced:
	case <-ended:
	case <-e.after(health.Backoff(attempt, base, rand.Float64())):
	}
	return nil, false
}

// inFlightHeld reports whether err is a health refusal by a budget in force that throttles on
// in_flight.
func (e *Engine) inFlightHeld(err error) bool {
	d, ok := err.(*Denial)
	if !ok || d.Reason != vocab.ReasonHealth {
		return false
	}
	for _, bs := range e.state.Load().budgets {
		if bs.name == d.Budget {
			_, ok := bs.throttle[rules.MetricInFlight]
			return ok
		}
	}
	return false
}
