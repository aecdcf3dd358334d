package engine

// HealthErrors reports how many reads and connects the current health sampler has failed
// (the telemetry's pgtraffic.health.errors counter). ok is false while no sampler exists (no
// budget uses a sampled metric). A sampler rebuilt for a new health_interval starts from zero,
// which metric backends read as a counter reset. The sampler counts no successful samples, so
// there is no samples counterpart. It only loads atomics: safe from a metrics callback.
func (e *Engine) HealthErrors() (n uint64, ok bool) {
	s := e.sampler.Load()
	if s == nil {
		return 0, false
	}
	return s.Errors(), true
}
