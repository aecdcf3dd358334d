package engine

import (
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/coord"
	"github.com/pgtraffic/pgtraffic/internal/health"
)

// healthElection links the health sampler to Redis while the rules have a coordination
// section: instances of one database then elect one sampler per metric set and the others
// read its sample (coord.Election). Guarded by lifecycle.mu; the sampler holds the election
// it was given, never the engine's lock.
type healthElection struct {
	section rules.Coordination // what el was built from
	el      *coord.Election
}

// elect makes the election follow cfg's coordination section, after coordinate has started
// its coordinator (whose instance id the election uses). It returns the election replaced,
// for the caller to close once the sampler has been given the new one. e.life.mu must be held.
func (e *Engine) elect(cfg *rules.Config) (replaced *coord.Election) {
	he := &e.life.elect
	sec := cfg.Coordination
	if he.el != nil && (sec == nil || *sec != he.section || e.life.closed) {
		replaced = he.el
		*he = healthElection{}
	}
	c := e.coordinator.Load()
	if sec == nil || he.el != nil || e.life.closed || c == nil || e.healthDatabase == "" {
		return replaced
	}
	el, err := coord.NewElection(coord.ElectionOptions{Client: e.redis, URL: sec.Redis,
		SyncInterval: time.Duration(sec.SyncInterval), Instance: c.Instance(), Database: e.healthDatabase})
	if err != nil {
		// The coordinator accepted the same URL; should it not, each instance samples alone.
		e.log.Warn("pgtraffic: no health sampler election; this instance samples for itself", "error", err)
		return replaced
	}
	he.section, he.el = *sec, el
	return replaced
}

// election is the health sampler's election: nil (no interface value) without one.
func (e *Engine) election() health.Election {
	if e.life.elect.el == nil {
		return nil
	}
	return e.life.elect.el
}

// closeElection closes an election the sampler no longer uses; leases it held lapse.
func (e *Engine) closeElection(el *coord.Election) {
	if el == nil {
		return
	}
	if err := el.Close(); err != nil {
		e.log.Debug("pgtraffic: closing the health sampler election's Redis client", "error", err)
	}
}
