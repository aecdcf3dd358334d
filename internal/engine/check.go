package engine

import (
	"context"

	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/pattern"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// checkPattern stands for "the job's next statement" in Check's denials.
var checkPattern = &pattern.Pattern{Fingerprint: "", Kind: pattern.KindOther}

// nominalCost is the cost Check asks the buckets for: one small statement (1 ms). A batch job
// that checks before a chunk wants to know whether its next statement would be admitted.
const nominalCost = 0.001

// Check reports whether a statement carrying ctx's tags would be admitted now by the enforce
// budgets its tags select: health thresholds, zero limits, concurrency and bucket room, and
// whether others wait for them first. It routes like a statement (built-in and context tags;
// the statement's own tags are unknown) and takes nothing. It returns nil or a *Denial.
func (e *Engine) Check(ctx context.Context) error {
	return e.check(ctx, noWait)
}

// Wait blocks until Check passes or ctx ends (then it returns ctx's error). It waits as a
// statement waits, in its budgets' queues and in arrival order, woken the moment there may be
// room, but without a bound on the queue or on the wait: a job that waits before a chunk holds
// no connection. Its turn passes as soon as Check does: it takes nothing, so the next waiter's
// turn follows at once.
func (e *Engine) Wait(ctx context.Context) error {
	return e.check(ctx, always)
}

// check is Check (noWait) and Wait (always): the admission of a nominal statement with ctx's
// tags that takes nothing.
func (e *Engine) check(ctx context.Context, p patience) error {
	st := e.state.Load()
	if st.rules == nil {
		return nil
	}
	x := &Exec{Result: Result{Pattern: checkPattern}, work: work{e: e, start: e.now()}}
	x.Tags = e.mergeTags(tagging.From(ctx), nil, nil, "")
	rt := &x.s.rt
	st.route(x.Tags, rt, nil, x.start)
	// The nominal statement costs nominalCost, or a budget's per_query_limit where that is
	// smaller: Check asks about room, and a job's statements are not this one.
	reqs := make([]budget.Request, len(rt.reqs))
	for i, r := range rt.reqs {
		r.Cost = nominalCost
		if pq := rt.owners[i].bs.perQuery.Seconds(); pq > 0 {
			r.Cost = min(r.Cost, pq)
		}
		reqs[i] = r
	}
	c := &claim{x: x, rt: rt, reqs: reqs, owners: rt.owners, health: rt.health, closed: rt.closed,
		quarantine: false, patience: p, w: &x.s.waiter}
	_, err := e.admit(ctx, st, c, x.start)
	return err
}
