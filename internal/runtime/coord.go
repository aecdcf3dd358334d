package runtime

import (
	"context"
	"errors"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/coord"
	"github.com/pgtraffic/pgtraffic/internal/engine"
)

// closeWithin bounds Close's goodbye to Redis (telling it this instance's slots are free):
// a connector's Close must not hang on an unreachable Redis, and the slots return when the
// leases lapse anyway.
const closeWithin = 500 * time.Millisecond

// coordination is the link to Redis while the rules have a coordination section: one
// coordinator, and a handle per shared budget. Guarded by Runtime.mu; nothing of it is on a
// statement's path (a budget kicks its handle through a function it was given).
type coordination struct {
	section rules.Coordination // what c was built from
	c       *coord.Coordinator // makes (and closes) its own client from the section's URL when not given one
	shared  map[string]*shared
	// next, in a coordination replaced by a reload, is the coordinator that replaced it, under
	// the same instance id: c closes into it, and it starts once c is closed (stopCoordination).
	// handed, then, is closed once it started (or was found closed): the ready of next's
	// coordination.
	next   *coord.Coordinator
	handed chan struct{}
	// ready, in a coordination that replaced another, is closed once the one it replaced
	// closed into c: c may close in turn only then (stopCoordination), so that the coordinators
	// of one instance id hand over one after the other, each to the next, and never two of
	// them talk to Redis under that id at once. Nil for a first coordinator.
	ready chan struct{}
}

// shared is one budget registered with the coordinator.
type shared struct {
	b      *budget.Budget
	h      *coord.Handle
	spec   coord.Spec
	leased bool // its limits are leases (b is the handle's Local); else it shares only quarantines
}

// checkCoordination reports a coordination section r cannot act on.
func (r *Runtime) checkCoordination(cfg *rules.Config) error {
	if co := cfg.Coordination; co != nil && co.Redis == "" && r.redis == nil {
		return errors.New("pgtraffic: coordination: no redis URL, and the connector was given no client (driver.WithRedisClient)")
	}
	return nil
}

// coordinate starts, changes or stops the coordination for cfg, compiled as compiled: the
// coordinator follows cfg's section (switchCoordinator), and each budget is shared or made
// local again (share). It returns the coordinator it replaced, for the caller to stop once r.mu
// is released; r.mu must be held. Nothing here waits for Redis.
func (r *Runtime) coordinate(cfg *rules.Config, compiled *engine.Rules) (old coordination, err error) {
	if old, err = r.switchCoordinator(cfg); err != nil {
		return old, err
	}
	r.share(cfg, compiled)
	return old, nil
}

// switchCoordinator replaces or stops the coordinator when cfg's coordination section is not
// the one it was built from, and starts one when cfg has a section and none runs. A new
// coordinator starts at once and never fails for want of Redis: its budgets run on their
// fallback share and it keeps trying. One that replaces another takes its instance id and
// starts only once the other closed into it (stopCoordination), its budgets keeping their
// leases meanwhile: each budget both share goes on in the new one as it was, leases and
// instances seen included, so that to Redis the instance never left. Under a new id its first
// sync would be granted only what the old id's entries leave (nothing, alone, while a
// goodbye that Redis did not answer leaves them to lapse), and a failed first sync would put
// its budgets on the provisional lease of an instance that never synced (the budget over
// fallback_instances). One that cannot be made (a URL its client refuses) is an
// error that leaves the coordinator in force as it was: a rejected reload keeps the last good
// rules, their sharing included.
func (r *Runtime) switchCoordinator(cfg *rules.Config) (old coordination, err error) {
	co := &r.co
	stale := co.c != nil && (cfg.Coordination == nil || *cfg.Coordination != co.section || r.closed)
	if cfg.Coordination == nil || r.closed {
		if stale {
			old, *co = *co, coordination{}
		}
		return old, nil
	}
	if co.c != nil && !stale {
		return old, nil
	}
	sec := *cfg.Coordination
	id := r.instance
	if co.c != nil {
		// The old coordinator closes into the new one once r.mu is released (stopCoordination),
		// before the new one starts: never are both live under the id.
		id = co.c.Instance()
	}
	c, err := coord.New(coord.Options{Client: r.redis, URL: sec.Redis, Interval: time.Duration(sec.SyncInterval),
		FallbackInstances: sec.FallbackInstances, Instance: id, Database: r.database, Logger: r.log, Now: r.now,
		Quarantines: quarantines{r.e}})
	if err != nil {
		return coordination{}, err
	}
	var ready chan struct{}
	if co.c != nil {
		old = *co
		ready = make(chan struct{})
		old.next, old.handed = c, ready // started once old.c closed into it
	}
	*co = coordination{section: sec, c: c, shared: map[string]*shared{}, ready: ready}
	if old.c == nil {
		co.c.Start()
	}
	return old, nil
}

// share registers each shared budget of cfg with the coordinator (its rate and max_concurrent
// become its leases, its quarantines are shared) and makes each budget no longer shared local
// again. A budget with neither leases nor a quarantine (a per_query_limit or max_duration alone
// hold per statement) has nothing to share and stays local.
func (r *Runtime) share(cfg *rules.Config, compiled *engine.Rules) {
	co := &r.co
	keep := map[string]bool{}
	for i := range cfg.Budgets {
		rb := &cfg.Budgets[i]
		b, limits := compiled.Budget(rb.Name)
		spec := coord.Spec{Name: rb.Name, Rate: limits.Rate, Burst: limits.Burst, MaxConcurrent: limits.MaxConcurrent,
			Quarantine: quarantineSpec(rb.Quarantine), Warn: rb.Mode == rules.ModeWarn}
		leased := spec.Rate > 0 || spec.MaxConcurrent > 0
		if co.c == nil || !cfg.IsShared(rb) || rb.Mode == rules.ModeOff || !leased && rb.Quarantine == nil {
			continue // local; or nothing to share
		}
		keep[rb.Name] = true
		if s, ok := co.shared[rb.Name]; ok && s.b == b && s.leased == leased {
			if s.spec != spec {
				s.h.SetSpec(spec)
				s.spec = spec
			}
			continue
		} else if ok {
			r.unshare(s)
		}
		var local coord.Local
		if leased {
			local = b
		}
		h := co.c.Register(spec, local) // makes b shared
		r.e.ShareQuarantines(rb.Name, h.Quarantine)
		co.shared[rb.Name] = &shared{b: b, h: h, spec: spec, leased: leased}
	}
	for name, s := range co.shared {
		if !keep[name] {
			r.unshare(s)
			delete(co.shared, name)
		}
	}
}

// unshare stops coordinating s's budget: its limits are local again and its quarantines no
// longer published.
func (r *Runtime) unshare(s *shared) {
	s.h.Close() // makes b local again
	r.e.ShareQuarantines(s.spec.Name, nil)
}

// stopCoordination stops co, detached from r, once the coordinator co replaced closed into it:
// it closes into the coordinator that replaced it, if any, which goes on with the budgets both
// share (coord.Coordinator.CloseInto); tells Redis within closeWithin that this instance leaves
// the others; makes its budgets local again but those; then starts the coordinator that
// replaced it (a closed one, replaced in turn or closed with r since, does not start). r.mu
// must not be held.
func (r *Runtime) stopCoordination(co coordination) {
	if co.ready != nil {
		<-co.ready // within closeWithin of the predecessor's own wait
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeWithin)
	defer cancel()
	if err := co.c.CloseInto(ctx, co.next); err != nil {
		r.log.Debug("pgtraffic: could not tell Redis this instance left; its leases lapse instead", "error", err)
	}
	r.unshareQuarantines(co)
	if co.next != nil {
		co.next.Start()
		close(co.handed)
	}
}

// unshareQuarantines stops publishing the quarantines of the budgets co shared, but those that
// the coordination in force shares under the same name (a reload that changed only the
// coordination section): their hooks are its own, set by share when it replaced co.
func (r *Runtime) unshareQuarantines(co coordination) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for name := range co.shared {
		if _, again := r.co.shared[name]; !again {
			r.e.ShareQuarantines(name, nil)
		}
	}
}

// quarantines hands the quarantines read from Redis to the engine (coord.Quarantines).
type quarantines struct{ e *engine.Engine }

func (q quarantines) AddQuarantines(now time.Time, spec coord.Spec, qs []coord.Quarantined) {
	in := make([]engine.Quarantined, len(qs))
	for i, x := range qs {
		in[i] = engine.Quarantined{Fingerprint: x.Fingerprint, Until: x.Until}
	}
	q.e.AddQuarantines(now, spec.Name, rules.Quarantine{After: spec.Quarantine.After, For: rules.Duration(spec.Quarantine.For)}, in)
}

// quarantineSpec converts a budget's quarantine settings for package coord.
func quarantineSpec(q *rules.Quarantine) coord.QuarantineSpec {
	if q == nil {
		return coord.QuarantineSpec{}
	}
	return coord.QuarantineSpec{After: q.After, For: time.Duration(q.For)}
}

// Coordination reports the shared budgets as this instance sees them (leases, global debt,
// instances, sync counters), sorted by name; nil without a coordination section.
func (r *Runtime) Coordination() []coord.Status {
	c := r.coordinator()
	if c == nil {
		return nil
	}
	return c.Status()
}

// Instance is this instance's id in Redis; "" without a coordination section.
func (r *Runtime) Instance() string {
	c := r.coordinator()
	if c == nil {
		return ""
	}
	return c.Instance()
}

// coordinator is the running coordinator; nil without one.
func (r *Runtime) coordinator() *coord.Coordinator {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.co.c
}
