package engine

import (
	"errors"
	"sync"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/budget"
)

// lifecycle is what runs beside the statements and changes what they read: SetConfig compiles
// the rules (compile.go), swaps them in and keeps the budgets' state across reloads; it starts,
// reconfigures and stops the health sampler (health.go) and the coordinator (coord.go); the
// watcher (watch.go) calls SetConfig; Close stops them all.
type lifecycle struct {
	// mu serialises SetConfig, WatchFile and Close, and protects the fields below. A reload holds
	// it throughout: its compile, the sampler's reconfiguration, the coordinator's goodbye to
	// Redis. That is why nothing else takes it: no statement, status reader or callback.
	mu     sync.Mutex
	closed bool
	gen    uint64 // generation of the last rules compiled (compiled.gen)
	// budgets by name: kept across reloads so debt and in-flight counts survive.
	budgets map[string]*budget.Budget
	watcher *watcher
	co      coordination   // shared budgets (coord.go)
	elect   healthElection // the health sampler's election (election.go)
}

// SetConfig validates cfg and puts it in force for the next statement. Budgets that keep their
// name keep their state (debt, in-flight counts), as does a budget removed and re-added while
// its statements still hold slots or its debt has not drained. On error the current rules stay.
// Statements are not held up by a reload: they read the rules in force until the new ones are
// swapped in.
func (e *Engine) SetConfig(cfg *rules.Config) error {
	if cfg == nil {
		cfg = &rules.Config{}
	}
	// Validated even when it comes from rules.Parse, which validated it: a Config is plain data
	// that the caller may have changed since, and a mark of "validated" would go stale.
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := e.checkCoordination(cfg); err != nil {
		return err
	}
	warnAllLapsed(e.log, cfg, e.now())
	e.life.mu.Lock()
	defer e.life.mu.Unlock()
	c, err := e.compile(cfg)
	if err != nil {
		return err
	}
	// Shared budgets take their leases before any statement sees them.
	if err := e.coordinate(cfg); err != nil {
		return err
	}
	e.state.Store(c)
	e.stats.Reloads.Add(1)
	replaced := e.elect(cfg)
	e.configureHealth(cfg, c.healthInterval)
	e.closeElection(replaced) // the sampler uses the new one from its next round
	return nil
}

// errClosed is WatchFile's error after Close.
var errClosed = errors.New("pgtraffic: the engine is closed")

// setWatcher makes w the engine's watcher, unless it has one or is closed.
func (l *lifecycle) setWatcher(w *watcher) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return errClosed
	case l.watcher != nil:
		return errors.New("pgtraffic: a rules file is already watched")
	}
	l.watcher = w
	return nil
}

// shut marks the engine closed and hands over what Close must stop; ok is false if it was
// closed already.
func (e *Engine) shut() (w *watcher, co coordination, h *sampling, el healthElection, ok bool) {
	e.life.mu.Lock()
	defer e.life.mu.Unlock()
	if e.life.closed {
		return nil, coordination{}, nil, healthElection{}, false
	}
	e.life.closed = true
	w, co, el = e.life.watcher, e.life.co, e.life.elect
	e.life.watcher, e.life.co, e.life.elect = nil, coordination{}, healthElection{}
	e.coordinator.Store(nil)
	return w, co, e.health.Load(), el, true
}

// Close stops the rules-file watcher, the health sampler (which hands its election's lease
// over), the coordinator (telling Redis, within closeWithin, that this instance leaves),
// holding no lock while it waits for them. Statements may still run after it, under the rules
// in force, with every budget local.
func (e *Engine) Close() error {
	w, co, h, el, ok := e.shut()
	if !ok {
		return nil
	}
	var errs []error
	if w != nil {
		errs = append(errs, w.close()) // its reload in progress, if any, returns first
	}
	if h != nil {
		errs = append(errs, h.s.Close()) // before its election's client closes
	}
	e.closeElection(el.el)
	if co.c != nil {
		e.stopCoordination(co)
	}
	return errors.Join(errs...)
}
