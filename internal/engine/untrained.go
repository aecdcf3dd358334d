package engine

import (
	"cmp"
	"context"
	"sync"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/budget"
)

// Probes. A pattern the model has never seen run is predicted from its planner cost alone, which
// can say little about time (a pg_sleep costs the planner almost nothing), and a budget charges
// the rest of a statement's cost only when it ends: a busy application's first statements of a
// new pattern would all be admitted against a bucket that sees them as free. So, under enforce
// budgets with a bucket, one statement of an untrained pattern runs at a time per engine, its
// probe; the others wait for it as for credit (within max_wait, else they are refused with a
// retry hint) and are then predicted from its run. A probe that hangs holds them back for at
// most the bucket's size in time (burst ÷ rate, which a statement that long fills by itself):
// after that they are admitted, charged at least what it has run.

// probes are the probes in flight, by pattern fingerprint id. Safe for concurrent use.
type probes struct {
	mu      sync.Mutex // protects the field below
	running map[uint64]*probe
}

type probe struct {
	start time.Time
	done  chan struct{} // closed when the probe ends, admitted or not
}

// probeWait is the size in time of spec's bucket; 0 without one.
func probeWait(spec budget.Spec) time.Duration {
	if !(spec.Rate > 0) {
		return 0
	}
	return time.Duration(cmp.Or(spec.Burst, spec.Rate) / spec.Rate * float64(time.Second)) // Burst 0: Spec's default
}

// limitProbe is a probe denial's Limit: the cost is unknown, the budget need not be full.
const limitProbe = "cost not known yet: the first statement of this pattern is running"

// awaitProbe makes x, whose pattern is untrained, the pattern's probe, or waits for the running
// one and predicts x anew (see above). It returns whether x waited, a *Denial when x may not
// wait, or ctx's error if ctx ended while waiting.
func (e *Engine) awaitProbe(ctx context.Context, st *compiled, x *Exec, rt *route) (waited bool, err error) {
	var bs *budgetState // the enforce budget with the largest bucket bounds the wait
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
		}
		e.probes.mu.Unlock()
		if p == nil {
			return waited, nil
		}
		ran := now.Sub(p.start)
		if ran >= bs.probeWait {
			x.Predicted = max(x.Predicted, ran.Seconds())
			return waited, nil
		}
		until, deadline := p.start.Add(bs.probeWait), x.start.Add(bs.maxWait)
		if bs.maxWait <= 0 || !now.Before(deadline) {
			d := &Denial{Budget: bs.name, Rule: st.ruleName[rule], Reason: ReasonBudget, Fingerprint: x.Pattern.Fingerprint,
				Limit: limitProbe, RetryAfter: min(max(ran, minRetry), until.Sub(now))} // about when it has run twice as long
			e.refuse(now, x, bs, d)
			return waited, d
		}
		if deadline.Before(until) {
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
		// The wait ran out (the loop refuses or charges), or the probe ended without training
		// the model (it failed or was refused): then the next statement becomes the probe.
	}
}

// endProbe ends x's probe, if x is one, waking the statements waiting for it.
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
