package engine

import (
	"context"
	"sync"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/budget"
)

// A pattern the cost model has never seen run is predicted from its planner cost alone, and
// the planner's units say little about time: a pg_sleep or a call into a slow function costs
// almost nothing to the planner. A budget charges a statement its prediction when it admits it
// and the rest only when it ends, so a busy application's first statements of a new pattern
// would all be admitted at once against a bucket that sees them as free.
//
// Hence probes: while a pattern is untrained, one of its statements at a time runs per engine
// under enforce budgets with a bucket. The others wait until it ends, as they would wait for
// credit (within max_wait, else they are refused and told when to retry), then are predicted
// from its execution. A probe that hangs must not hold them back for ever: from the longest
// burst_limit of their buckets after the probe's start on (a statement that long has filled
// the bucket by itself), they are admitted charged at least what the probe has run. The
// cost: the first statements of each new pattern wait for one execution, or are refused
// without max_wait; statements of trained patterns never meet a probe.

// probes are the engine's running probes, one per untrained pattern (by fingerprint id).
// Safe for concurrent use.
type probes struct {
	mu      sync.Mutex // protects the field below
	running map[uint64]*probe
}

// probe is one untrained pattern's statement in flight.
type probe struct {
	start time.Time     // when it was admitted
	done  chan struct{} // closed when it ends, admitted or not
}

// probeWait is how long the statements of an untrained pattern wait for its probe under a
// budget of spec: its bucket's size in time; 0 without a bucket (no wait).
func probeWait(spec budget.Spec) time.Duration {
	if !(spec.Rate > 0) {
		return 0
	}
	burst := spec.Burst
	if !(burst > 0) {
		burst = spec.Rate // budget.Spec's default
	}
	return time.Duration(burst / spec.Rate * float64(time.Second))
}

// limitProbe is a probe denial's Limit: the statement is refused because its cost is not
// known yet, not because the budget is full.
const limitProbe = "cost not known yet: the first statement of this pattern is running"

// awaitProbe runs before the admission of x, whose pattern is untrained: x becomes the
// pattern's probe, or waits for the running one (see above) and is predicted anew. It waits
// only as a statement may wait for credit: within the max_wait of the budget whose bucket
// bounds the wait, else it is refused with a *Denial. It returns whether x waited, and ctx's
// error if ctx ended while waiting.
func (e *Engine) awaitProbe(ctx context.Context, st *compiled, x *Exec, rt *route) (waited bool, err error) {
	var bs *budgetState
	rule := 0
	for i, bi := range rt.budgets {
		if b := st.budgets[bi]; b.mode == modeEnforce && b.probeWait > 0 && (bs == nil || b.probeWait > bs.probeWait) {
			bs, rule = b, rt.ruleOf[i]
		}
	}
	if bs == nil {
		return false, nil
	}
	fp := x.Pattern.FingerprintID
	for {
		now := e.now()
		e.probes.mu.Lock()
		p := e.probes.running[fp]
		if p == nil {
			if e.probes.running == nil {
				e.probes.running = map[uint64]*probe{}
			}
			x.probe = &probe{start: now, done: make(chan struct{})}
			e.probes.running[fp] = x.probe
			e.probes.mu.Unlock()
			return waited, nil
		}
		e.probes.mu.Unlock()
		ran := now.Sub(p.start)
		if ran >= bs.probeWait {
			// The probe runs long: charge at least what it has run so far.
			x.Predicted = max(x.Predicted, ran.Seconds())
			return waited, nil
		}
		until := p.start.Add(bs.probeWait)
		if deadline := x.start.Add(bs.maxWait); bs.maxWait <= 0 || !now.Before(deadline) {
			// Retry once the probe has run about twice as long as now.
			d := &Denial{Budget: bs.name, Rule: st.ruleName[rule], Reason: ReasonBudget,
				Fingerprint: x.Pattern.Fingerprint, Limit: limitProbe,
				RetryAfter: min(max(ran, minRetry), until.Sub(now))}
			e.refuse(now, x, d)
			return waited, d
		} else if deadline.Before(until) {
			until = deadline
		}
		select {
		case <-ctx.Done():
			return waited, ctx.Err()
		case <-e.after(until.Sub(now)):
		case <-p.done:
		}
		waited = true
		if pred := e.model.Predict(e.now(), fp, x.PlanCost); pred.Samples > 0 {
			x.Predicted = pred.Seconds
			return waited, nil
		}
		// Either the wait ran out (the loop refuses or charges) or the probe ended without
		// training the model (it failed or was refused): the next statement becomes the probe.
	}
}

// endProbe ends x's probe, if it is one, waking the statements waiting for it.
func (e *Engine) endProbe(x *Exec) {
	p := x.probe
	if p == nil {
		return
	}
	x.probe = nil
	e.probes.mu.Lock()
	if e.probes.running[x.Pattern.FingerprintID] == p {
		delete(e.probes.running, x.Pattern.FingerprintID)
	}
	e.probes.mu.Unlock()
	close(p.done)
}
