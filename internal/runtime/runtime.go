package runtime

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/coord"
	"github.com/pgtraffic/pgtraffic/internal/engine"
	"github.com/pgtraffic/pgtraffic/internal/health"
	"github.com/pgtraffic/pgtraffic/internal/serverclock"
)

// Options configure a Runtime.
// The runtime logs to the engine's logger and keeps the engine's clock (engine.Options).
type Options struct {
	// HealthConnect opens the health sampler's dedicated connection. Nil disables health metrics.
	HealthConnect func(ctx context.Context) (health.Conn, error)
	// HealthDatabase identifies the database the sampler reads, without secrets (e.g.
	// user@host:port/dbname): with a coordination section, instances whose identities are
	// equal elect one sampler (election.go). Empty: each samples for itself.
	HealthDatabase string
	// Database identifies the server and database the budgets limit, without secrets (e.g.
	// host:port/dbname): with a coordination section, instances whose identities are equal
	// share a budget of one name (coord.Options.Database). Empty: a budget's name alone.
	Database string
	// ElectionSecret reads a secret of the database that every instance of it can read and
	// Redis does not hold: the election signs its samples with a key derived from it
	// (coord.ElectionOptions.Secret). Nil: no election, each instance samples for itself.
	ElectionSecret func(ctx context.Context) (string, error)
	// ServerClockConnect opens the server clock reader's dedicated connection
	// (package serverclock). Nil disables the server's clock: costs stay on the client's.
	ServerClockConnect func(ctx context.Context) (serverclock.Conn, error)

	// Redis, when set, is the client shared budgets coordinate through, instead of one made
	// from the coordination section's URL (coord.go). Instance names this instance in Redis
	// (tests: two in one process); a random id when empty.
	Redis    redis.UniversalClient
	Instance string
}

// Runtime runs what changes the rules an engine decides by: it compiles each Config into the
// engine, watches the rules file, and starts, reconfigures and stops the health sampler and
// the coordinator of shared budgets. It is safe for concurrent use.
type Runtime struct {
	e              *engine.Engine
	log            *slog.Logger
	now            func() time.Time
	after          func(time.Duration) <-chan time.Time
	healthConnect  func(ctx context.Context) (health.Conn, error)
	healthDatabase string
	database       string
	electionSecret func(ctx context.Context) (string, error)
	clockConnect   func(ctx context.Context) (serverclock.Conn, error)
	redis          redis.UniversalClient
	instance       string

	// mu serialises the installs of rules and Close, and protects the fields below. It is held
	// for in-memory steps only: never across a compile, a file read, Redis or the database
	// (SetConfig compiles before it takes mu, and stops what a reload replaced after).
	mu        sync.Mutex
	closed    bool
	installed uint64 // Gen of the rules last installed
	watcher   *watcher
	co        coordination   // shared budgets (coord.go)
	vote      healthElection // the health sampler's election (election.go)
	health    *sampling      // the health sampler; nil until a budget uses a sampled metric (health.go)
	sampled   healthSet      // the metrics the rules in force throttle on, with their queries
	clock     clockReading   // the server clock reader (serverclock.go)
}

// New returns the runtime of e, with no rules in force.
func New(e *engine.Engine, o Options) *Runtime {
	now, after := e.Clock()
	return &Runtime{e: e, log: e.Logger(), now: now, after: after, healthConnect: o.HealthConnect,
		healthDatabase: o.HealthDatabase, database: o.Database, electionSecret: o.ElectionSecret, clockConnect: o.ServerClockConnect,
		redis: o.Redis, instance: o.Instance}
}

// errNilConfig is SetConfig's error for a nil Config.
var errNilConfig = errors.New("pgtraffic: SetConfig: the Config is nil (an unchecked ParseConfig error?); the rules in force stay (an empty Config removes every budget and guard)")

// Engine is the engine r configures.
func (r *Runtime) Engine() *engine.Engine { return r.e }

// SetConfig validates cfg and puts it in force for the next statement. Budgets that keep their
// name keep their state (debt, in-flight counts), as does a budget removed and re-added while
// its statements still hold slots or its debt has not drained. On error the current rules stay.
// Statements are not held up by a reload: they read the rules in force until the new ones are
// swapped in. Of two SetConfig calls at once, the later one's rules are the ones left in force.
// It keeps a copy of cfg: the caller may go on changing its own (to prepare the next reload)
// without changing, or racing with, the rules in force. It returns once the budgets it shares
// anew have their first leases, or a sync's call deadline passed (leased). A nil cfg is an
// error: it is what a reload gets from a parse error it did not check, not a wish to remove
// every budget and guard (an empty Config is).
func (r *Runtime) SetConfig(cfg *rules.Config) error {
	_, err := r.setConfig(cfg)
	return err
}

// setConfig is SetConfig. It returns the generation (engine.Rules.Gen) of the rules it put in
// force, 0 when a later SetConfig's were put in force first (they stay).
func (r *Runtime) setConfig(cfg *rules.Config) (gen uint64, err error) {
	if cfg == nil {
		return 0, errNilConfig
	}
	cfg = cfg.Clone()
	if err := r.checkCoordination(cfg); err != nil {
		return 0, err
	}
	for {
		compiled, err := r.e.Compile(cfg)
		if err != nil {
			return 0, err
		}
		installed, stop, err := r.install(cfg, compiled)
		if err := stop.run(r); err != nil { // what the reload replaced, stopped holding no lock
			r.log.Warn("pgtraffic: closing the replaced health sampler", "error", err)
		}
		if installed {
			r.leased()
			return compiled.Gen(), err
		}
		if err != nil {
			return 0, err
		}
		if stop.superseded {
			return 0, nil // a later SetConfig's rules are in force
		}
		// Another reload was installed while this one compiled: compile again, against its budgets.
	}
}

// leased waits, holding no lock, until the coordinator in force has leased the shared budgets
// just installed, or a sync's call deadline passed (coord.Coordinator.Leased): the connector
// opens, and a budget newly shared by a reload starts, with its lease.
func (r *Runtime) leased() {
	r.mu.Lock()
	c := r.co.c
	r.mu.Unlock()
	if c != nil {
		c.Leased()
	}
}

// stopped is what an install replaced, to be stopped once r.mu is released.
type stopped struct {
	superseded bool                // a later SetConfig was installed first: nothing done
	co         coordination        // a coordinator replaced or removed
	election   *coord.Election     // a health sampler election replaced or removed
	samplers   [2]*health.Sampler  // samplers replaced or no longer needed (nil: none)
	reader     *serverclock.Reader // a server clock reader replaced or no longer needed
}

// run stops what s holds: the sampler first, which hands its election's lease over, then the
// election's client, then the coordinator.
func (s stopped) run(r *Runtime) error {
	var err error
	for _, sm := range s.samplers {
		if sm != nil {
			err = errors.Join(err, sm.Close())
		}
	}
	if s.reader != nil {
		err = errors.Join(err, s.reader.Close())
	}
	r.closeElection(s.election)
	if s.co.c != nil {
		r.stopCoordination(s.co)
	}
	return err
}

// install puts compiled, built from cfg, in force, unless a later SetConfig's rules are in
// force already (stop.superseded) or another install came after its Compile (installed false:
// compile again). Shared budgets take their leases before any statement sees them.
func (r *Runtime) install(cfg *rules.Config, compiled *engine.Rules) (installed bool, stop stopped, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case compiled.Gen() < r.installed:
		return false, stopped{superseded: true}, nil
	case !r.e.Current(compiled):
		return false, stopped{}, nil
	}
	if stop.co, err = r.coordinate(cfg, compiled); err != nil {
		return false, stop, err
	}
	stop.election = r.elect(cfg) // the sampler takes the new one from its next round
	// The sampler is given the new rules' metrics before the rules are in force, and keeps the
	// replaced rules' until then: a statement decided by either finds each metric its budgets
	// throttle on configured (one not read yet neither throttles nor counts as stale), never
	// one the sampler was not told to read (stale, so refused by an enforce budget).
	interval, next := compiled.HealthInterval(), sampledBy(cfg)
	during := r.sampled.with(next)
	stop.samplers[0] = r.configureHealth(during, interval)
	r.e.Install(compiled)
	r.installed = compiled.Gen()
	if !during.equal(next) {
		stop.samplers[1] = r.configureHealth(next, interval) // the replaced rules' metrics go
	}
	r.sampled = next
	stop.reader = r.configureServerClock(cfg, interval)
	return true, stop, nil
}

// inForce reports whether the rules of generation gen (setConfig) are the ones in force.
func (r *Runtime) inForce(gen uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return gen != 0 && r.installed == gen
}

// errClosed is WatchFile's error after Close.
var errClosed = errors.New("pgtraffic: the connector is closed")

// setWatcher makes w the watcher, unless there is one or r is closed.
func (r *Runtime) setWatcher(w *watcher) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return errClosed
	case r.watcher != nil:
		return errors.New("pgtraffic: a rules file is already watched")
	}
	r.watcher = w
	return nil
}

// shut marks r closed and hands over what Close must stop; ok is false if it was closed already.
func (r *Runtime) shut() (w *watcher, stop stopped, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, stopped{}, false
	}
	r.closed = true
	w, stop.co, stop.election = r.watcher, r.co, r.vote.el
	if r.health != nil {
		stop.samplers[0] = r.health.s // its counts stay readable: Close keeps them
	}
	stop.reader = r.clock.rd // its counts stay readable too
	r.watcher, r.co, r.vote = nil, coordination{}, healthElection{}
	return w, stop, true
}

// Close stops the rules-file watcher, the health sampler (which hands its election's lease
// over) and the coordinator (telling Redis, within closeWithin, that this instance leaves),
// holding no lock while it waits for them.
// Statements may still run after it, under the rules in force, with every budget local.
func (r *Runtime) Close() error {
	w, stop, ok := r.shut()
	if !ok {
		return nil
	}
	var err error
	if w != nil {
		err = w.close() // its reload in progress, if any, returns first
	}
	return errors.Join(err, stop.run(r))
}

// BudgetState is one budget's live state, with its coordination when it is shared.
type BudgetState struct {
	engine.BudgetState
	Shared *coord.Status // a shared budget's leases, global debt and instances; nil when local
}

// Budgets reports every budget in force, in rules-file order.
func (r *Runtime) Budgets() []BudgetState {
	shared := r.Coordination()
	var out []BudgetState
	for _, b := range r.e.Budgets() {
		s := BudgetState{BudgetState: b}
		for i := range shared {
			if shared[i].Name == b.Name {
				s.Shared = &shared[i]
			}
		}
		out = append(out, s)
	}
	return out
}
