package driver

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	goruntime "runtime"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/internal/cost/pgxexplain"
	"github.com/pgtraffic/pgtraffic/internal/engine"
	"github.com/pgtraffic/pgtraffic/internal/health"
	"github.com/pgtraffic/pgtraffic/internal/health/pgxconn"
	"github.com/pgtraffic/pgtraffic/internal/runtime"
	clockconn "github.com/pgtraffic/pgtraffic/internal/serverclock/pgxconn"
)

// core is what both front ends, [Connector] (database/sql) and [Pool] (pgxpool), are made of:
// the engine that decides each statement, its telemetry, and the switches every statement
// reads. It carries the calls both offer (Check, Wait, Snapshot, Handler, SetConfig), so that
// each is written once. It is safe for concurrent use once built.
type core struct {
	engine *engine.Engine
	rt     *runtime.Runtime // the engine's rules, watcher, health sampler and coordinator
	tel    *telemetry
	intr   *interceptor // the engine and the switches every statement reads
	log    *slog.Logger
}

// newCore builds a front end's core for connections made from cc: the engine with cc's
// built-in tags and a health sampler on a connection of its own made from cc, less its tracer,
// with dial (the front end's way to make a connection, its hooks included), the rules o names,
// and telemetry. On an error everything it started is stopped.
func newCore(cc *pgx.ConnConfig, dial pgxconn.Dial, o *options) (*core, error) {
	tel, err := newTelemetry(o, cc)
	if err != nil {
		return nil, err
	}
	c := &core{tel: tel, log: cmp.Or(o.logger, slog.Default())}
	// pgtraffic's own connections are made from cc without its tracer: the application's tracer
	// (otelpgx, a query logger) is for the queries the application sends, not for the health
	// samples and server clock reads, several a second, it never sent.
	own := cc.Copy()
	own.Tracer = nil
	healthConfig := own.Copy()
	if healthConfig.RuntimeParams == nil {
		healthConfig.RuntimeParams = map[string]string{}
	}
	healthConfig.RuntimeParams[applicationName] = health.ApplicationName
	c.engine = engine.New(engine.Options{
		Logger:           o.logger,
		PatternCacheSize: o.patternCacheSize,
		MaxBuckets:       o.maxBuckets,
		User:             cc.User,
		Database:         databaseOf(cc),
		ApplicationName:  cc.RuntimeParams[applicationName],
		Observer:         tel.observer(),
	})
	c.rt = runtime.New(c.engine, runtime.Options{
		// The sampler's own connection, never one of the application's pool.
		HealthConnect:  pgxconn.Connector(healthConfig, dial),
		HealthDatabase: healthDatabase(cc),
		Database:       serverOf(cc),
		ElectionSecret: pgxconn.SystemID(healthConfig, dial),
		// The server clock reader's too.
		ServerClockConnect: clockconn.Connector(own, dial),
		Redis:              o.redis,
	})
	switch {
	case o.config != nil:
		err = c.rt.SetConfig(o.config)
	case o.configSet:
		err = errors.New("pgtraffic: WithConfig: the Config is nil (an unchecked ParseConfig error?); leave the option out to run without rules")
	case o.rulesFile != "":
		err = c.rt.WatchFile(o.rulesFile, o.maxRulesFileSize)
	case o.rulesFileSet:
		err = errors.New("pgtraffic: WithRulesFile: the path is empty (leave the option out to run without rules)")
	}
	if err == nil {
		err = tel.attach(c.rt) // the gauges' callback; close unregisters it
	}
	var lk *leaks
	if err == nil {
		lk, err = newLeaks(tel.meter, o.logger)
	}
	if err != nil {
		c.close()
		return nil, err
	}
	c.intr = &interceptor{engine: c.engine, commenter: o.sqlCommenter, leaks: lk}
	return c, nil
}

// serverOf identifies the server and database connections made from cc reach, as instances
// that share a coordination section name them, never with a secret: every host and port tried,
// the database, and the check that chooses among the hosts (target_session_attrs: behind one
// host list, a primary and its standbys are different servers). Instances share a budget when
// they name the same server and budget, so that shards, or a primary and its standbys, each
// keep their budgets of one name to themselves. Instances that reach one server under other
// names (an IP and a host name) share nothing: each then holds the budget as if it were alone.
func serverOf(cc *pgx.ConnConfig) string {
	hosts := []string{fmt.Sprintf("%s:%d", cc.Host, cc.Port)}
	for _, f := range cc.Fallbacks { // one per host and TLS mode tried
		if h := fmt.Sprintf("%s:%d", f.Host, f.Port); !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	id := strings.Join(hosts, ",") + "/" + databaseOf(cc)
	if cc.ValidateConnect != nil {
		// pgx's check for target_session_attrs (or the application's own), by its name.
		id += "?" + goruntime.FuncForPC(reflect.ValueOf(cc.ValidateConnect).Pointer()).Name()
	}
	return id
}

// healthDatabase identifies the session cc's health sampler and server clock reader read
// from, for their election: serverOf with the user and the runtime parameters the session
// starts with (search_path: an unqualified health query reads the tables of the schemas it
// names), but application_name, which the sampler sets to its own. Instances whose sessions
// differ elect apart, which costs a query more per interval, never a sample of another
// server or schema.
func healthDatabase(cc *pgx.ConnConfig) string {
	id := cc.User + "@" + serverOf(cc)
	for _, k := range slices.Sorted(maps.Keys(cc.RuntimeParams)) {
		if k != applicationName {
			id += ";" + k + "=" + cc.RuntimeParams[k]
		}
	}
	return id
}

// applicationName is PostgreSQL's parameter that names a session's application (not the
// built-in tag of that name).
const applicationName = "application_name"

// databaseOf is the database connections made from cc reach: the one cc names, else, as
// PostgreSQL does when the startup message names none, the one named after the user.
func databaseOf(cc *pgx.ConnConfig) string { return cmp.Or(cc.Database, cc.User) }

// close stops everything newCore started; statements still waiting for capacity return
// ErrClosed.
func (c *core) close() error {
	c.engine.Close()
	return errors.Join(c.tel.close(), c.rt.Close())
}

// SetConfig puts cfg in force before the next statement. Budgets that keep their name keep their
// state. An invalid cfg is an error and the rules in force stay, as is a nil cfg (what an
// unchecked ParseConfig error leaves); an empty Config removes every budget and guard.
// pgtraffic keeps a copy of cfg: changing cfg afterwards changes nothing until it is passed to
// SetConfig again. A budget it shares anew through Redis has its first lease when it returns,
// unless Redis did not answer within a quarter sync_interval. After Close it returns ErrClosed
// and changes nothing.
func (c *core) SetConfig(cfg *Config) error {
	if c.engine.Closed() {
		return ErrClosed
	}
	return c.rt.SetConfig(cfg)
}

// explainOn is conn, the connection a statement will run on, as the engine takes it (for
// EXPLAIN); nil when there is none.
func explainOn(conn *pgx.Conn) engine.Conn {
	if conn == nil {
		return nil
	}
	return pgxexplain.On(conn)
}
