package driver

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgtraffic/pgtraffic/internal/health/pgxconn"
)

// Name is the name the driver registers with database/sql.
const Name = "pgtraffic"

// EnvRules names the environment variable read by sql.Open("pgtraffic", dsn) for the rules file.
const EnvRules = "PGTRAFFIC_RULES"

// registered is the Driver registered as Name, and every connector's Driver.
var registered = &Driver{}

func init() {
	sql.Register(Name, registered)
}

// Driver is the database/sql driver registered as "pgtraffic". Its connectors read the rules file
// named by PGTRAFFIC_RULES when set. The zero value is ready to use; it is safe for concurrent use.
type Driver struct {
	mu sync.Mutex // protects the field below
	// open keeps one connector per DSN for Open, so that connections opened without
	// database/sql's connector share their budgets and start one rules watcher, not one each.
	open map[string]*Connector
}

var (
	_ driver.Driver        = (*Driver)(nil)
	_ driver.DriverContext = (*Driver)(nil)
)

// Open opens a single connection. database/sql uses OpenConnector instead; Open exists for the
// driver.Driver interface. Connections opened this way for one DSN share one connector, which
// lives as long as the process.
//
// The connector is made without d's lock held: making one reads files (the DSN's passfile, the
// rules file), compiles the rules and runs the application's telemetry and log handler, none of
// which may hold up an Open of another DSN. When two Opens of one DSN make one each, the first
// kept is the DSN's, and the other is closed.
func (d *Driver) Open(dsn string) (driver.Conn, error) {
	c := d.opened(dsn)
	if c == nil {
		made, err := newConnector(dsn, nil, true)
		if err != nil {
			return nil, err
		}
		if c = d.keep(dsn, made); c != made {
			made.Close()
		}
	}
	return c.Connect(context.Background())
}

// opened is the connector kept for dsn, or nil.
func (d *Driver) opened(dsn string) *Connector {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.open[dsn]
}

// keep keeps c as dsn's connector unless one is kept already, and returns the one kept.
func (d *Driver) keep(dsn string, c *Connector) *Connector {
	d.mu.Lock()
	defer d.mu.Unlock()
	if kept := d.open[dsn]; kept != nil {
		return kept
	}
	if d.open == nil {
		d.open = map[string]*Connector{}
	}
	d.open[dsn] = c
	return c
}

// OpenConnector returns a [*Connector] for dsn, with rules from PGTRAFFIC_RULES when set.
func (d *Driver) OpenConnector(dsn string) (driver.Connector, error) {
	return newConnector(dsn, nil, true)
}

// Connector is a driver.Connector that applies pgtraffic to every connection it opens. Create
// one with [NewConnector] and pass it to sql.OpenDB, or use [Open]. It is safe for concurrent
// use. Close (called by (*sql.DB).Close) stops the rules watcher and the health sampler.
type Connector struct {
	*core
	pgx driver.Connector // pgx's stdlib connector: opens the connections pgtraffic wraps
}

var (
	_ driver.Connector = (*Connector)(nil)
	_ io.Closer        = (*Connector)(nil)
)

// Open returns a *sql.DB whose connections go through pgtraffic.
func Open(dsn string, opts ...Option) (*sql.DB, error) {
	c, err := NewConnector(dsn, opts...)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(c), nil
}

// NewConnector parses dsn (a PostgreSQL URL or keyword/value string, as pgx.ParseConfig) and
// returns a connector. A rules file that is missing or invalid is an error.
func NewConnector(dsn string, opts ...Option) (*Connector, error) {
	return newConnector(dsn, opts, false)
}

// NewConnectorFromConfig returns a connector for a connection configuration made by
// pgx.ParseConfig and then adjusted in code (a TLS config, a dialer, a tracer, OnNotice...): what
// pgx's stdlib.OpenDB and stdlib.RegisterConnConfig are for. The connector keeps a copy, so later
// changes to cfg do not reach it. Pass the result to sql.OpenDB:
//
//	cfg, err := pgx.ParseConfig(dsn)
//	...
//	cfg.Tracer = myTracer
//	c, err := driver.NewConnectorFromConfig(cfg, driver.WithRulesFile(path))
//	...
//	db := sql.OpenDB(c)
func NewConnectorFromConfig(cfg *pgx.ConnConfig, opts ...Option) (*Connector, error) {
	if cfg == nil {
		return nil, errors.New("pgtraffic: NewConnectorFromConfig: the pgx.ConnConfig is nil")
	}
	// pgx panics when it connects with a config that pgx.ParseConfig did not make; ParseConfig
	// always sets the dialer, so its absence is the sign, and an error here is kinder than a
	// panic in the first query.
	if cfg.DialFunc == nil || cfg.LookupFunc == nil {
		return nil, errors.New("pgtraffic: NewConnectorFromConfig: the pgx.ConnConfig must be created by pgx.ParseConfig")
	}
	return fromConfig(cfg.Copy(), buildOptions(opts, false))
}

// buildOptions applies opts over the defaults; fromEnv: the rules file named by PGTRAFFIC_RULES
// comes first, so that an option can replace it.
func buildOptions(opts []Option, fromEnv bool) options {
	var o options
	if fromEnv {
		if path := os.Getenv(EnvRules); path != "" {
			o.rulesFile = path
		}
	}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

func newConnector(dsn string, opts []Option, fromEnv bool) (*Connector, error) {
	o := buildOptions(opts, fromEnv)
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, dsnError(err)
	}
	return fromConfig(cc, o)
}

// dsnError is the error of a DSN that pgx could not parse: pgx's reason, without the DSN or
// the detail under it. pgx quotes the DSN with its password redacted as well as it can, which a
// keyword/value DSN spaced as libpq allows (password = secret) defeats, and its error's
// ConnString holds the DSN whole; the detail quotes the DSN's values as they came (the word
// after an unquoted space in a password, key material given where a file's path belongs). None
// of them reaches the caller, who has the DSN anyway.
func dsnError(err error) error {
	var pce *pgconn.ParseConfigError
	if !errors.As(err, &pce) {
		return errors.New("pgtraffic: cannot parse the DSN")
	}
	bare := *pce
	bare.ConnString = "" // pgx's message about it: "cannot parse ``: invalid port"
	reason := strings.TrimPrefix(bare.Error(), "cannot parse ``: ")
	if detail := errors.Unwrap(pce); detail != nil {
		reason = strings.TrimSuffix(reason, " ("+detail.Error()+")") + " (pgx's detail is not shown: it quotes the DSN)"
	}
	return errors.New("pgtraffic: cannot parse the DSN (not shown: it may hold a password): " + reason)
}

// fromConfig makes the connector; cc is its own.
func fromConfig(cc *pgx.ConnConfig, o options) (*Connector, error) {
	co, err := newCore(cc, stdlibDial(o.pgxOptions), &o)
	if err != nil {
		return nil, err
	}
	return &Connector{core: co, pgx: stdlib.GetConnector(*cc, o.pgxOptions...)}, nil
}

// stdlibDial makes pgtraffic's own connections (the health sampler's, the server clock
// reader's) as pgx's stdlib connector makes the application's: with the options given to
// WithPgxOptions, so that stdlib.OptionBeforeConnect sets what changes per connection (a
// rotating password or token) on them too, and OptionAfterConnect runs on them. The stdlib
// connector connects right after its hook, so a tracer the hook sets stays on them: the
// README says to set the tracer on the ConnConfig (NewConnectorFromConfig) instead.
func stdlibDial(opts []stdlib.OptionOpenDB) pgxconn.Dial {
	if len(opts) == 0 {
		return nil
	}
	return func(ctx context.Context, cc *pgx.ConnConfig) (*pgx.Conn, error) {
		c, err := stdlib.GetConnector(*cc, opts...).Connect(ctx)
		if err != nil {
			return nil, err
		}
		return c.(*stdlib.Conn).Conn(), nil
	}
}

// Connect opens a connection (database/sql calls it): pgx's, wrapped.
func (c *Connector) Connect(ctx context.Context) (driver.Conn, error) {
	if c.engine.Closed() {
		// Its rules watcher, health sampler and telemetry are stopped: a connection now would
		// run under rules frozen at the close, throttled for good by a stale health sample.
		return nil, ErrClosed
	}
	pc, err := c.pgx.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return newConn(pc, c.intr)
}

// Driver returns the pgtraffic driver, the one registered with database/sql, the same value on
// every call.
func (c *Connector) Driver() driver.Driver { return registered }

// Close stops everything the connector started. (*sql.DB).Close calls it. Statements waiting
// for capacity (max_wait) on the connector's connections return [ErrClosed] at once.
func (c *Connector) Close() error { return c.close() }
