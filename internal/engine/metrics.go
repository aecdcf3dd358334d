package engine

// HealthErrors reports how many health reads and connects have failed (the telemetry's
// pgtraffic.health.errors counter), including those of samplers replaced when health_interval
// changed, so the counter never resets. ok is false while no sampler was ever started. It only
// loads atomics: safe from a metrics callback.
func (e *Engine) HealthErrors() (n uint64, ok bool) {
	base := e.healthErrBase.Load()
	s := e.sampler.Load()
	if s == nil {
		return base, base > 0
	}
	return base + s.Errors(), true
}

// HealthSamples reports how many health metric reads succeeded, across sampler rebuilds (the
// telemetry's pgtraffic.health.samples counter). ok is false while no sampler was ever started.
func (e *Engine) HealthSamples() (n uint64, ok bool) {
	base := e.healthSampleBase.Load()
	s := e.sampler.Load()
	if s == nil {
		return base, base > 0
	}
	return base + s.Samples(), true
}
