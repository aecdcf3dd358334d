package runtime

import (
	"slices"
	"sort"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/health"
)

// sampling is the health sampler in use, if any, with the counts of the samplers it replaced
// (when health_interval changed, or when no budget used a sampled metric for a while): a
// metrics callback never sees a replaced sampler's counts twice, so its counters never reset.
type sampling struct {
	s                   *health.Sampler // nil while no budget uses a sampled metric
	interval            time.Duration   // the interval s was built with
	errBase, sampleBase uint64
	sharedBase          uint64
	electionBase        uint64
}

// retired is h's counts without its sampler, which its caller closes.
func (h *sampling) retired() *sampling {
	return &sampling{errBase: h.errBase + h.s.Errors(), sampleBase: h.sampleBase + h.s.Samples(),
		sharedBase: h.sharedBase + h.s.Shared(), electionBase: h.electionBase + h.s.Elections()}
}

// configureHealth starts, reconfigures or stops the health sampler for cfg, and hands it to the
// engine. No sampler runs, and no connection is open, while no budget uses a sampled metric.
// r.mu must be held; the sampler replaced, if any, is returned for the caller to close once
// r.mu is released.
func (r *Runtime) configureHealth(cfg *rules.Config, interval time.Duration) (replaced *health.Sampler) {
	metrics := healthMetrics(cfg)
	h := r.health
	if h != nil && h.s != nil {
		if len(metrics) > 0 && r.healthConnect != nil && !r.closed && h.interval == interval {
			h.s.SetMetrics(metrics, cfg.HealthQueries)
			h.s.SetElection(r.election())
			h.s.Start()
			return nil
		}
		replaced, h = h.s, h.retired()
		r.health = h
		r.e.SetHealth(nil)
	}
	if len(metrics) == 0 || r.healthConnect == nil || r.closed {
		return replaced
	}
	next := &sampling{interval: interval, s: health.NewSampler(health.Options{
		Connect:  r.healthConnect,
		Interval: interval,
		Metrics:  metrics,
		Queries:  cfg.HealthQueries,
		Logger:   r.log,
		Now:      r.now,
		Election: r.election(),
	})}
	if h != nil {
		next.errBase, next.sampleBase, next.sharedBase, next.electionBase = h.errBase, h.sampleBase, h.sharedBase, h.electionBase
	}
	r.health = next
	r.e.SetHealth(next.s)
	next.s.Start()
	return replaced
}

// healthMetrics lists the sampled metrics the budgets use (in_flight is local, not sampled).
func healthMetrics(cfg *rules.Config) []string {
	var out []string
	for _, b := range cfg.Budgets {
		if b.Mode == rules.ModeOff {
			continue
		}
		for k := range b.ThrottleWhen {
			if k != rules.MetricInFlight && !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	sort.Strings(out)
	return out
}

// sampler returns the health sampler in use; nil while none was ever started.
func (r *Runtime) sampler() *sampling {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.health
}

// HealthErrors reports how many health reads and connects have failed (the telemetry's
// pgtraffic.health.errors counter), including those of samplers replaced when health_interval
// changed, so the counter never resets. ok is false while no sampler was ever started.
func (r *Runtime) HealthErrors() (n uint64, ok bool) {
	h := r.sampler()
	if h == nil {
		return 0, false
	}
	if h.s == nil {
		return h.errBase, true
	}
	return h.errBase + h.s.Errors(), true
}

// HealthSamples reports how many health metric reads succeeded, across sampler rebuilds (the
// telemetry's pgtraffic.health.samples counter). ok is false while no sampler was ever started.
func (r *Runtime) HealthSamples() (n uint64, ok bool) {
	h := r.sampler()
	if h == nil {
		return 0, false
	}
	if h.s == nil {
		return h.sampleBase, true
	}
	return h.sampleBase + h.s.Samples(), true
}

// HealthShared reports how many health readings were adopted from the elected sampler of this
// database through Redis, across sampler rebuilds (pgtraffic.health.shared_samples). ok is
// false while no sampler was ever started.
func (r *Runtime) HealthShared() (n uint64, ok bool) {
	h := r.sampler()
	if h == nil {
		return 0, false
	}
	if h.s == nil {
		return h.sharedBase, true
	}
	return h.sharedBase + h.s.Shared(), true
}

// HealthElections reports how many times this instance's sampler became or stopped being its
// database's elected sampler, across sampler rebuilds (pgtraffic.health.elections). ok is false
// while no sampler was ever started.
func (r *Runtime) HealthElections() (n uint64, ok bool) {
	h := r.sampler()
	if h == nil {
		return 0, false
	}
	if h.s == nil {
		return h.electionBase, true
	}
	return h.electionBase + h.s.Elections(), true
}
