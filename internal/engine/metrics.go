package engine

// HealthErrors reports how many health reads and connects have failed (the telemetry's
// pgtraffic.health.errors counter), including those of samplers replaced when health_interval
// changed, so the counter never resets. ok is false while no sampler was ever started. The
// sampler counts no successful samples, so there is no samples counterpart. It only loads
// atomics: safe from a metrics callback.
func (e *Engine) HealthErrors() (n uint64, ok bool) {
	base := e.healthErrBase.Load()
	s := e.sampler.Load()
	if s == nil {
		return base, base > 0
	}
	return base + s.Errors(), true
}
