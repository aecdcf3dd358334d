package driver

import (
	"github.com/pgtraffic/pgtraffic/internal/runtime"
	"go.opentelemetry.io/otel/metric"
)

// coordInstruments are the metrics of shared budgets (pgtraffic.coordination.*), observed in
// the connector's one gauge callback: per shared budget, this instance's leases, the global
// debt and instances as last seen, whether it runs on its fallback share, and its syncs.
type coordInstruments struct {
	rate, burst, debt, latency metric.Float64ObservableGauge
	slots, instances, fallback metric.Int64ObservableGauge
	syncs, failures            metric.Int64ObservableCounter
}

// newCoordInstruments makes the instruments on ob, which collects their errors.
func newCoordInstruments(ob *observables) (*coordInstruments, []metric.Observable) {
	fg, ig, ic := ob.floatGauge, ob.intGauge, ob.counter
	c := &coordInstruments{
		rate:      fg(metricLeaseRate, "s/s", "Execution seconds per second this instance's leases of the shared budget grant."),
		burst:     fg(metricLeaseBurst, "s", "Execution seconds of bucket this instance's leases of the shared budget grant."),
		slots:     ig(metricLeaseSlots, "{statement}", "Concurrency slots of the shared budget held by this instance."),
		debt:      fg(metricGlobalDebt, "s", "The shared budget's debt across every instance, as of the last sync."),
		instances: ig(metricInstances, "{instance}", "Live instances sharing the budget, as of the last sync."),
		fallback:  ig(metricFallback, "1", "1 while the last sync failed and the budget runs on its last or fallback share."),
		latency:   fg(metricSyncLatency, "s", "Duration of the last successful sync with Redis."),
		syncs:     ic(metricSyncs, "{sync}", "Successful syncs with Redis."),
		failures:  ic(metricSyncFailures, "{sync}", "Failed syncs with Redis (timeouts, unreachable)."),
	}
	return c, []metric.Observable{c.rate, c.burst, c.slots, c.debt, c.instances, c.fallback, c.latency,
		c.syncs, c.failures}
}

// observe reports every shared budget of rt, with the attributes perBudget gives it.
func (c *coordInstruments) observe(o metric.Observer, rt *runtime.Runtime, perBudget func(string) metric.MeasurementOption) {
	for _, s := range rt.Coordination() {
		attrs := perBudget(s.Name)
		o.ObserveFloat64(c.rate, s.Rate, attrs)
		o.ObserveFloat64(c.burst, s.Burst, attrs)
		o.ObserveInt64(c.slots, int64(s.Slots), attrs)
		o.ObserveFloat64(c.debt, s.GlobalDebt, attrs)
		o.ObserveInt64(c.instances, int64(s.Instances), attrs)
		fallback := int64(0)
		if s.Fallback {
			fallback = 1
		}
		o.ObserveInt64(c.fallback, fallback, attrs)
		if s.Syncs > 0 {
			o.ObserveFloat64(c.latency, s.Latency.Seconds(), attrs)
		}
		o.ObserveInt64(c.syncs, clampInt64(s.Syncs), attrs)
		o.ObserveInt64(c.failures, clampInt64(s.Failures), attrs)
	}
}
