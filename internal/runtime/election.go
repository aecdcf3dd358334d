package runtime

import (
	"context"
	"sync"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/coord"
	"github.com/pgtraffic/pgtraffic/internal/health"
)

// healthElection links the health sampler to Redis while the rules have a coordination
// section: instances of one database then elect one sampler per metric set and the others
// read its sample (coord.Election). Guarded by Runtime.mu; the sampler holds the election it
// was given, never the runtime's lock.
type healthElection struct {
	section rules.Coordination // what el was built from
	el      *coord.Election
}

// elect makes the election follow cfg's coordination section, after coordinate has started
// its coordinator (whose instance id the election uses). It returns the election replaced, for
// the caller to close once the sampler has been given the new one and r.mu is released. r.mu
// must be held. Making an election opens no connection: its first round reads the database's
// secret (Options.ElectionSecret) in the background.
func (r *Runtime) elect(cfg *rules.Config) (replaced *coord.Election) {
	he := &r.vote
	sec := cfg.Coordination
	if he.el != nil && (sec == nil || *sec != he.section || r.closed) {
		replaced = he.el
		*he = healthElection{}
	}
	c := r.co.c
	if sec == nil || he.el != nil || r.closed || c == nil || r.healthDatabase == "" || r.electionSecret == nil {
		return replaced
	}
	el, err := coord.NewElection(coord.ElectionOptions{Client: r.redis, URL: sec.Redis,
		SyncInterval: time.Duration(sec.SyncInterval), Instance: c.Instance(), Database: r.healthDatabase,
		Secret: r.secretReader()})
	if err != nil {
		// The coordinator accepted the same URL; should it not, each instance samples alone.
		r.log.Warn("pgtraffic: no health sampler election; this instance samples for itself", "error", err)
		return replaced
	}
	he.section, he.el = *sec, el
	return replaced
}

// secretReader is Options.ElectionSecret for one election, which logs its first failure: until
// it succeeds, each instance samples for itself.
func (r *Runtime) secretReader() func(ctx context.Context) (string, error) {
	var once sync.Once
	return func(ctx context.Context) (string, error) {
		secret, err := r.electionSecret(ctx)
		if err != nil && ctx.Err() == nil {
			once.Do(func() {
				r.log.Warn("pgtraffic: the health sampler election cannot read the database's system identifier, "+
					"which signs its samples; this instance samples for itself until it can", "error", err)
			})
		}
		return secret, err
	}
}

// election is the health sampler's election: nil (no interface value) without one. r.mu must
// be held.
func (r *Runtime) election() health.Election {
	if r.vote.el == nil {
		return nil
	}
	return r.vote.el
}

// closeElection closes an election the sampler no longer uses; leases it held lapse. r.mu
// must not be held.
func (r *Runtime) closeElection(el *coord.Election) {
	if el == nil {
		return
	}
	if err := el.Close(); err != nil {
		r.log.Debug("pgtraffic: closing the health sampler election's Redis client", "error", err)
	}
}
