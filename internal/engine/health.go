package engine

import (
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/health"
)

// sampling is the health sampler in use with the counts of the samplers it replaced (when
// health_interval changed), swapped whole: a metrics callback never sees a replaced sampler's
// counts twice or not at all, so its counters never reset.
type sampling struct {
	s                   *health.Sampler
	interval            time.Duration // the interval s was built with
	errBase, sampleBase uint64
	sharedBase          uint64
	electionBase        uint64
}

// sampler returns the health sampler in use; nil while none was ever started.
func (e *Engine) sampler() *health.Sampler {
	if h := e.health.Load(); h != nil {
		return h.s
	}
	return nil
}

// configureHealth starts, reconfigures or idles the health sampler for cfg. The sampler opens
// nothing while no budget uses a sampled metric. e.life.mu must be held; statements only load
// e.health, so they do not wait for a sampler's connection to close.
func (e *Engine) configureHealth(cfg *rules.Config, interval time.Duration) {
	metrics := healthMetrics(cfg)
	h := e.health.Load()
	if h != nil {
		h.s.SetElection(e.election())
	}
	if len(metrics) == 0 || e.healthConnect == nil || e.life.closed {
		if h != nil {
			h.s.SetMetrics(nil, nil) // closes its connection
		}
		return
	}
	if h != nil && h.interval == interval {
		h.s.SetMetrics(metrics, cfg.HealthQueries)
		h.s.Start()
		return
	}
	next := &sampling{interval: interval, s: health.NewSampler(health.Options{
		Connect:  e.healthConnect,
		Interval: interval,
		Metrics:  metrics,
		Queries:  cfg.HealthQueries,
		Logger:   e.log,
		Now:      e.now,
		Election: e.election(),
	})}
	if h != nil {
		h.s.Close() // its counts are final once closed
		next.errBase, next.sampleBase = h.errBase+h.s.Errors(), h.sampleBase+h.s.Samples()
		next.sharedBase, next.electionBase = h.sharedBase+h.s.Shared(), h.electionBase+h.s.Elections()
	}
	e.health.Store(next)
	next.s.Start()
}

// HealthErrors reports how many health reads and connects have failed (the telemetry's
// pgtraffic.health.errors counter), including those of samplers replaced when health_interval
// changed, so the counter never resets. ok is false while no sampler was ever started. It only
// loads atomics: safe from a metrics callback.
func (e *Engine) HealthErrors() (n uint64, ok bool) {
	h := e.health.Load()
	if h == nil {
		return 0, false
	}
	return h.errBase + h.s.Errors(), true
}

// HealthSamples reports how many health metric reads succeeded, across sampler rebuilds (the
// telemetry's pgtraffic.health.samples counter). ok is false while no sampler was ever started.
func (e *Engine) HealthSamples() (n uint64, ok bool) {
	h := e.health.Load()
	if h == nil {
		return 0, false
	}
	return h.sampleBase + h.s.Samples(), true
}

// HealthShared reports how many health readings were adopted from the elected sampler of this
// database through Redis, across sampler rebuilds (pgtraffic.health.shared_samples). ok is
// false while no sampler was ever started.
func (e *Engine) HealthShared() (n uint64, ok bool) {
	h := e.health.Load()
	if h == nil {
		return 0, false
	}
	return h.sharedBase + h.s.Shared(), true
}

// HealthElections reports how many times this engine's sampler became or stopped being its
// database's elected sampler, across sampler rebuilds (pgtraffic.health.elections). ok is
// false while no sampler was ever started.
func (e *Engine) HealthElections() (n uint64, ok bool) {
	h := e.health.Load()
	if h == nil {
		return 0, false
	}
	return h.electionBase + h.s.Elections(), true
}
