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
// under enforce budgets with a bucket. The others wait until it ends, then are predicted from
// its execution. A probe that hangs must not stall them for ever: they wait at most the
// longest burst_limit of their buckets from the probe's start (a statement that long has
// filled the bucket by itself), then are admitted charged at least what the probe has run.
// The cost: the first statements of each new pattern run one after the other, for one
// execution; statements of trained patterns never meet a probe.

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

// awaitProbe runs before the admission of x, whose pattern is untrained: x becomes the
// pattern's probe, or waits for the running one (see above) and is predicted anew. It
// returns whether x waited, and ctx's error if ctx ended while waiting.
func (e *Engine) awaitProbe(ctx context.Context, st *compiled, x *Exec, rt *route) (waited bool, err error) {
	limit := time.Duration(0)
	for _, bi := range rt.budgets {
		if bs := st.budgets[bi]; bs.mode == modeEnforce {
			limit = max(limit, bs.probeWait)
		}
	}
	if limit <= 0 {
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
		until := p.start.Add(limit)
		if !now.Before(until) {
			// The probe runs long: charge at least what it has run so far.
			x.Predicted = max(x.Predicted, now.Sub(p.start).Seconds())
			return waited, nil
		}
		select {
		case <-ctx.Done():
			return waited, ctx.Err()
		case <-e.after(until.Sub(now)):
		case <-p.done:
		}
		waited = true
		pred := e.model.Predict(e.now(), fp, x.PlanCost)
		if pred.Samples > 0 {
			x.Predicted = pred.Seconds
			return waited, nil
		}
		// The probe ended without training the model (it failed or was refused): the next
		// statement becomes the probe.
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
