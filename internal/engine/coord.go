package engine

import (
	"context"
	"errors"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/coord"
)

// closeWithin bounds Close's goodbye to Redis (telling it this instance's slots are free):
// a connector's Close must not hang on an unreachable Redis, and the slots return when the
// leases lapse anyway.
const closeWithin = 500 * time.Millisecond

// coordination is the engine's link to Redis while the rules have a coordination section: one
// coordinator, and a handle per shared budget. Guarded by lifecycle.mu; nothing of it is on a
// statement's path (a budget kicks its handle through a function it was given).
type coordination struct {
	section rules.Coordination // what c was built from
	c       *coord.Coordinator // makes (and closes) its own client from the section's URL when not given one
	shared  map[string]*shared
}

// shared is one budget registered with the coordinator.
type shared struct {
	b      *budget.Budget
	h      *coord.Handle
	spec   coord.Spec
	leased bool // its limits are leases (b is the handle's Local); else it shares only quarantines
}

// checkCoordination reports a coordination section the engine cannot act on.
func (e *Engine) checkCoordination(cfg *rules.Config) error {
	if co := cfg.Coordination; co != nil && co.Redis == "" && e.redis == nil {
		return errors.New("pgtraffic: coordination: no redis URL, and the connector was given no client (driver.WithRedisClient)")
	}
	return nil
}

// coordinate starts, changes or stops the coordination for cfg, whose budgets compile has just
// put in e.life.budgets: each shared budget is registered (its rate and max_concurrent become
// its leases, its quarantines are shared), each budget no longer shared is made local again.
// A budget with neither leases nor a quarantine (a per_query_limit or max_duration alone hold
// per statement) has nothing to share and stays local. A new coordinator starts at once and never
// fails for want of Redis: its budgets run on their fallback share and it keeps trying.
// e.life.mu must be held: the old coordinator says goodbye before a new one starts under the
// same instance name.
func (e *Engine) coordinate(cfg *rules.Config) error {
	now := e.now()
	co := &e.life.co
	if co.c != nil && (cfg.Coordination == nil || *cfg.Coordination != co.section || e.life.closed) {
		old := *co
		*co = coordination{}
		e.coordinator.Store(nil)
		e.stopCoordination(old)
	}
	if cfg.Coordination != nil && co.c == nil && !e.life.closed {
		sec := *cfg.Coordination
		interval := time.Duration(sec.SyncInterval)
		c, err := coord.New(coord.Options{Client: e.redis, URL: sec.Redis, Interval: interval,
			FallbackInstances: sec.FallbackInstances, Instance: e.instance, Logger: e.log, Now: e.now,
			Quarantines: &e.quarantined})
		if err != nil {
			return err
		}
		co.section, co.c = sec, c
		co.shared = map[string]*shared{}
		co.c.Start()
		e.coordinator.Store(co.c)
	}
	cores := serverCores(cfg)
	keep := map[string]bool{}
	for i := range cfg.Budgets {
		rb := &cfg.Budgets[i]
		spec := coord.Spec{Name: rb.Name, Rate: deref(rb.ServerShare) * cores, Burst: time.Duration(rb.BurstLimit).Seconds(),
			MaxConcurrent: deref(rb.MaxConcurrent), Quarantine: coordQuarantine(rb.Quarantine)}
		leased := spec.Rate > 0 || spec.MaxConcurrent > 0
		if co.c == nil || !cfg.IsShared(rb) || parseMode(rb.Mode) == modeOff || !leased && rb.Quarantine == nil {
			continue // local; or nothing to share
		}
		keep[rb.Name] = true
		b := e.life.budgets[rb.Name]
		if s, ok := co.shared[rb.Name]; ok && s.b == b && s.leased == leased {
			if s.spec != spec {
				s.h.SetSpec(spec)
				s.spec = spec
			}
			continue
		} else if ok {
			e.unshare(now, s)
		}
		var local coord.Local
		if leased {
			local = b
		}
		h := co.c.Register(spec, local)
		if leased {
			// A partition without credit is told to retry when its first lease is due.
			b.SetShared(now, h.Kick, co.c.FirstLeaseIn())
		}
		e.quarantined.share(rb.Name, h.Quarantine)
		co.shared[rb.Name] = &shared{b: b, h: h, spec: spec, leased: leased}
	}
	for name, s := range co.shared {
		if !keep[name] {
			e.unshare(now, s)
			delete(co.shared, name)
		}
	}
	return nil
}

// unshare stops coordinating s's budget: its limits are local again and its quarantines no
// longer published.
func (e *Engine) unshare(now time.Time, s *shared) {
	s.h.Close()
	e.quarantined.share(s.spec.Name, nil)
	if s.leased {
		s.b.SetShared(now, nil, 0)
	}
}

// stopCoordination stops co, detached from the engine, telling Redis within closeWithin that
// this instance leaves, and makes its budgets local again.
func (e *Engine) stopCoordination(co coordination) {
	ctx, cancel := context.WithTimeout(context.Background(), closeWithin)
	defer cancel()
	if err := co.c.Close(ctx); err != nil {
		e.log.Debug("pgtraffic: could not tell Redis this instance left; its leases lapse instead", "error", err)
	}
	now := e.now()
	for _, s := range co.shared {
		e.quarantined.share(s.spec.Name, nil)
		if s.leased {
			s.b.SetShared(now, nil, 0)
		}
	}
}

// Coordination reports the shared budgets as this instance sees them (leases, global debt,
// instances, sync counters), sorted by name; nil without a coordination section.
func (e *Engine) Coordination() []coord.Status {
	c := e.coordinator.Load()
	if c == nil {
		return nil
	}
	return c.Status()
}

// Instance is this engine's instance id in Redis; "" without a coordination section.
func (e *Engine) Instance() string {
	c := e.coordinator.Load()
	if c == nil {
		return ""
	}
	return c.Instance()
}
