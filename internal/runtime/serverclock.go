package runtime

import (
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/health"
	"github.com/pgtraffic/pgtraffic/internal/serverclock"
)

// clockReading is the server clock reader in use, if any, with the counts of the readers it
// replaced, so that the counters a metrics callback reads never go back.
type clockReading struct {
	rd       *serverclock.Reader // nil while no budget needs a cost
	interval time.Duration
	el       health.Election // the election rd was given
	base     serverclock.Counts
}

// counts is c's counts: its base plus its reader's.
func (c *clockReading) counts() serverclock.Counts {
	n := c.base
	if c.rd != nil {
		m := c.rd.Counts()
		n.Reads += m.Reads
		n.Failures += m.Failures
		n.Resets += m.Resets
		n.Rejected += m.Rejected
		n.Shared += m.Shared
	}
	return n
}

// configureServerClock starts or stops the server clock reader for cfg: it runs, every health
// interval, while a budget that is not off needs a statement's cost (a server_share or a
// per_query_limit). With the health sampler's election (a coordination section), instances of
// one database elect one reader in it; a new election starts a new reader. r.mu must be held; the reader replaced, if any, is returned for the caller
// to close once r.mu is released.
func (r *Runtime) configureServerClock(cfg *rules.Config, interval time.Duration) (replaced *serverclock.Reader) {
	c := &r.clock
	if c.rd != nil {
		if needsCost(cfg) && !r.closed && c.interval == interval && c.el == r.election() {
			return nil
		}
		replaced = c.rd
		c.base, c.rd = c.counts(), nil
	}
	if !needsCost(cfg) || r.clockConnect == nil || r.closed {
		r.e.SetNetworkFloor(0)
		return replaced
	}
	c.interval, c.el = interval, r.election()
	c.rd = serverclock.NewReader(serverclock.Options{
		Connect:  r.clockConnect,
		Sink:     r.e,
		Interval: interval,
		Logger:   r.log,
		Now:      r.now,
		Election: c.el,
		Previous: replaced,
	})
	c.rd.Start()
	return replaced
}

// needsCost reports whether a budget of cfg that is not off predicts statements' costs.
func needsCost(cfg *rules.Config) bool {
	for _, b := range cfg.Budgets {
		if b.Mode != rules.ModeOff && (b.PerQueryLimit > 0 || (b.ServerShare != nil)) {
			return true
		}
	}
	return false
}

// ServerClock reports the server clock reader's counts; ok is false while none was ever
// started. It holds the runtime's lock for a few steps: safe from a metrics callback.
func (r *Runtime) ServerClock() (c serverclock.Counts, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.clock.rd == nil && r.clock.base == (serverclock.Counts{}) && r.clock.interval == 0 {
		return serverclock.Counts{}, false
	}
	return r.clock.counts(), true
}
