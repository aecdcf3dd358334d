package runtime

import (
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/health"
)

// sampling is the health sampler in use, if any, with the counts of the samplers it replaced
// (when health_interval changed, or when no budget used a sampled metric for a while): a
// metrics callback never sees a replaced sampler's counts twice, so its counters never reset.
type sampling struct {
	s        *health.Sampler // nil while no budget uses a sampled metric
	interval time.Duration   // the interval s was built with
	base     HealthCounts    // the counts of the samplers replaced
}

// HealthCounts are the health sampler's event counts, across the samplers a reload replaced
// (the telemetry's pgtraffic.health.* counters, which never reset).
type HealthCounts struct {
	Errors    uint64 // failed health reads and connects
	Samples   uint64 // health queries this instance ran that succeeded
	Shared    uint64 // readings adopted from the sampler elected for the database, through Redis
	Elections uint64 // times this instance became or stopped being that sampler
}

// counts is h's counts: its base plus its sampler's.
func (h *sampling) counts() HealthCounts {
	c := h.base
	if h.s != nil {
		c.Errors += h.s.Errors()
		c.Samples += h.s.Samples()
		c.Shared += h.s.Shared()
		c.Elections += h.s.Elections()
	}
	return c
}

// retired is h's counts without its sampler, which its caller closes.
func (h *sampling) retired() *sampling { return &sampling{base: h.counts()} }

// healthSet is what a rule set has the health sampler read: the sampled metrics its budgets
// throttle on, sorted, and the health queries of the custom ones, by name (custom.<name>).
type healthSet struct {
	metrics []string
	queries map[string]string
}

// sampledBy is cfg's healthSet.
func sampledBy(cfg *rules.Config) healthSet {
	metrics := healthMetrics(cfg)
	queries := make(map[string]string)
	for _, m := range metrics {
		if name, ok := strings.CutPrefix(m, rules.CustomMetricPrefix); ok {
			if q, ok := cfg.HealthQueries[name]; ok {
				queries[name] = q
			}
		}
	}
	return healthSet{metrics: metrics, queries: queries}
}

// with is h and next together: next's metrics and h's, a custom metric's query next's where
// both read it.
func (h healthSet) with(next healthSet) healthSet {
	metrics := slices.Clone(next.metrics)
	queries := maps.Clone(next.queries)
	for _, m := range h.metrics {
		if slices.Contains(metrics, m) {
			continue
		}
		metrics = append(metrics, m)
		if name, ok := strings.CutPrefix(m, rules.CustomMetricPrefix); ok {
			if q, ok := h.queries[name]; ok {
				queries[name] = q
			}
		}
	}
	sort.Strings(metrics)
	return healthSet{metrics: metrics, queries: queries}
}

func (h healthSet) equal(o healthSet) bool {
	return slices.Equal(h.metrics, o.metrics) && maps.Equal(h.queries, o.queries)
}

// configureHealth starts, reconfigures or stops the health sampler to read set, and hands it to
// the engine. No sampler runs, and no connection is open, while no budget uses a sampled
// metric. A new interval takes a new sampler (a Sampler's interval is fixed), which starts from
// the readings of the one it replaces and is handed to the engine in the replaced one's place
// in one step: no statement finds no sampler in between, which would admit a budget throttled
// on the last sample. r.mu must be held; the sampler replaced, if any, is returned for the
// caller to close once r.mu is released.
func (r *Runtime) configureHealth(set healthSet, interval time.Duration) (replaced *health.Sampler) {
	metrics := set.metrics
	sample := len(metrics) > 0 && r.healthConnect != nil && !r.closed
	h := r.health
	if h != nil && h.s != nil {
		if sample && h.interval == interval {
			h.s.SetMetrics(metrics, set.queries)
			h.s.SetElection(r.election())
			h.s.Start()
			return nil
		}
		replaced, h = h.s, h.retired()
		r.health = h
	}
	if !sample {
		if replaced != nil {
			r.e.SetHealth(nil)
		}
		return replaced
	}
	next := &sampling{interval: interval, s: health.NewSampler(health.Options{
		Connect:  r.healthConnect,
		Interval: interval,
		Metrics:  metrics,
		Queries:  set.queries,
		Logger:   r.log,
		Now:      r.now,
		Election: r.election(),
		// A new interval: the last sample stays in force until the new sampler reads, so that
		// a budget throttled on it is not let through meanwhile (nor one admitted refused).
		Replaces: replaced,
	})}
	if h != nil {
		next.base = h.base
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

// Health reports the health sampler's counts; ok is false while no sampler was ever started.
// It holds the runtime's lock for a few steps, never across I/O: safe from a metrics callback.
func (r *Runtime) Health() (c HealthCounts, ok bool) {
	h := r.sampler()
	if h == nil {
		return HealthCounts{}, false
	}
	return h.counts(), true
}
