package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"

	"github.com/pgtraffic/pgtraffic/internal/health/pgxconn"
	"github.com/pgtraffic/pgtraffic/internal/pattern"
)

// Pool is pgtraffic's pgx-native front end: a *pgxpool.Pool whose statements are decided as
// the database/sql driver decides them, with the same rules, tags, budgets, guards, telemetry
// and [*BlockedError]. Make one with [NewPool] or [NewPoolFromConfig]. It has pgxpool's query
// surface (Exec, Query, QueryRow, SendBatch, CopyFrom, Begin), so it satisfies sqlc's pgx/v5
// DBTX, and the [Connector]'s calls (Check, Wait, Snapshot, Handler, SetConfig).
//
// Each statement (and batch) is decided before it takes a connection from the pool, whenever
// its decision needs no EXPLAIN: a refused statement is refused at once and never waits for or
// takes a connection, and a statement waiting for capacity (max_wait) holds none. Once admitted
// it keeps its budget slots while it waits for a connection; the wait for the pool is not
// counted as its cost, and if no connection comes (its context ends) the slots go back at no
// cost. Those slots are pending until it has its connection: a statement on a held connection
// (a transaction's, a [PoolConn]'s) is never held up by them, since they may wait for the very
// connection it holds; a statement overtaken meanwhile is decided again once it has its
// connection, which it gives back if refused then. Only a statement whose cost needs an EXPLAIN
// on its connection, under a budget with a bucket or a per_query_limit, takes the connection
// first and gives it back at once if refused; if it must wait (max_wait), it waits holding it.
// That is one of a pattern not yet costed, one a minute per pattern whose cached plan has
// expired (explain: pattern or auto; statements of that pattern arriving meanwhile wait for
// that EXPLAIN holding no connection), and every one under explain: call. What refuses a
// statement whatever it costs (a health threshold, a zero limit, a quarantine) is decided
// before that, and under explain: auto a pattern whose cost varies widely is priced by its
// latest plan here rather than explained per call. Its budget slots are held until Exec
// returns, the rows are closed or read to the end, Row.Scan returns, or the batch's results
// are closed.
//
// A statement run by the name of one prepared on the pool's connections (pgx runs it when its
// name is passed as the SQL), by the pool's AfterConnect hook or with a transaction's Prepare,
// is decided as the text it was prepared from, on the pool, its connections and in its
// transactions; one name prepared with different texts is decided as the name. With an
// AfterConnect hook, the pool's first statements wait until it has run on a connection, so
// that those names are known. Statements prepared through a connection's Conn are not seen.
//
// [Pool.Acquire], [Pool.AcquireFunc] and [Pool.AcquireAllIdle] hand out [*PoolConn]s,
// connections whose statements are controlled too. Ping, Stat, [Pool.Config] and [Pool.Reset]
// are pgxpool's, not decided. A Pool is safe for concurrent use. Close it to close its
// connections and stop what it started (the rules watcher and the health sampler). [Pool.Raw]
// is the pgxpool underneath, for code that needs pgxpool's own type; statements sent through
// it bypass control.
type Pool struct {
	*core
	run  *runner
	pool *pgxpool.Pool
	// dest is where the pool's statements run: on a connection each takes once it is admitted.
	dest dest
	// afterConnect is the application's AfterConnect hook, which the pool's runs (learnAfter).
	afterConnect func(context.Context, *pgx.Conn) error
}

// NewPool parses dsn as pgxpool.ParseConfig does (a PostgreSQL URL or keyword/value string,
// with the pool_* settings) and returns a pool. It takes the options [Open] takes; a rules file
// that is missing or invalid is an error. The health sampler, when a budget needs it, reads on
// a connection of its own, never one of the pool's.
func NewPool(ctx context.Context, dsn string, opts ...Option) (*Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, dsnError(err)
	}
	return newPool(ctx, cfg, buildOptions(opts, false))
}

// NewPoolFromConfig returns a pool for a configuration made by pgxpool.ParseConfig and then
// adjusted in code (hooks such as AfterConnect, a TLS config, a tracer). The pool keeps a copy,
// so later changes to cfg do not reach it. The statements its AfterConnect hook prepares are
// read from each new connection after the hook (pg_prepared_statements), so that a statement
// run by one of their names is decided as its text.
func NewPoolFromConfig(ctx context.Context, cfg *pgxpool.Config, opts ...Option) (*Pool, error) {
	if cfg == nil {
		return nil, errors.New("pgtraffic: NewPoolFromConfig: the pgxpool.Config is nil")
	}
	// pgxpool panics on a config that pgxpool.ParseConfig did not make: an error is kinder.
	if cfg.ConnConfig == nil || cfg.ConnConfig.DialFunc == nil || cfg.ConnConfig.LookupFunc == nil {
		return nil, errors.New("pgtraffic: NewPoolFromConfig: the pgxpool.Config must be created by pgxpool.ParseConfig")
	}
	return newPool(ctx, cfg.Copy(), buildOptions(opts, false))
}

// newPool makes the pool; cfg is its own.
func newPool(ctx context.Context, cfg *pgxpool.Config, o options) (*Pool, error) {
	co, err := newCore(cfg.ConnConfig, poolDial(cfg.BeforeConnect), &o)
	if err != nil {
		return nil, err
	}
	p := &Pool{core: co, run: newRunner(co), afterConnect: cfg.AfterConnect}
	cfg.AfterConnect = learnAfter(cfg.AfterConnect, &p.run.names)
	p.run.names.pending.Store(cfg.AfterConnect != nil)
	if p.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		co.close()
		return nil, fmt.Errorf("pgtraffic: %w", err)
	}
	p.dest = dest{pool: poolConns{p.pool}, names: &p.run.names}
	return p, nil
}

// learnAfter is the pool's AfterConnect hook: the application's, after which the names of the
// statements it prepared on the new connection are recorded (preparedNames), so that a
// statement run by one of them is decided as its text. Without a hook of the application's,
// nothing is prepared on a new connection, and nothing is read.
func learnAfter(after func(context.Context, *pgx.Conn) error, names *preparedNames) func(context.Context, *pgx.Conn) error {
	if after == nil {
		return nil
	}
	return func(ctx context.Context, c *pgx.Conn) error {
		if err := after(ctx, c); err != nil {
			return err
		}
		names.learn(ctx, c)
		return nil
	}
}

// poolDial makes pgtraffic's own connections (the health sampler's, the server clock
// reader's) as the pool makes its own: through its BeforeConnect hook, which sets what
// changes per connection (a rotating password or token). A tracer the hook sets is the
// application's, for its queries: it does not stay on pgtraffic's connections.
func poolDial(before func(context.Context, *pgx.ConnConfig) error) pgxconn.Dial {
	if before == nil {
		return nil
	}
	return func(ctx context.Context, cc *pgx.ConnConfig) (*pgx.Conn, error) {
		if err := before(ctx, cc); err != nil {
			return nil, err
		}
		cc.Tracer = nil
		return pgx.ConnectConfig(ctx, cc)
	}
}

// errPoolClosed is a closed Pool's answer to a statement, a batch or a copy: it matches
// ErrClosed, and puddle.ErrClosedPool, pgxpool's answer to a closed pool's Begin, Acquire and
// Ping, which code written for pgxpool checks for.
var errPoolClosed = fmt.Errorf("%w (%w)", ErrClosed, puddle.ErrClosedPool)

// closedPool is err, pgxpool's, as errPoolClosed when it says the pool is closed: a statement
// admitted before Close that waited for a connection, or a Begin, Acquire or Ping after it,
// is answered as the closed Pool's statements are.
func closedPool(err error) error {
	if errors.Is(err, puddle.ErrClosedPool) {
		return errPoolClosed
	}
	return err
}

// ready readies the pool for a statement of text sql: errPoolClosed once it is closed, so that
// the statement is refused before the engine decides it (nothing counted, no span); and, for a
// statement that may be run by a name (mayBeName), it waits for the names of the statements
// the pool's AfterConnect hook prepares (learnNames). Once the names are known it reads the
// closed state and one atomic flag.
func (p *Pool) ready(ctx context.Context, sql string) error {
	if p.engine.Closed() {
		return errPoolClosed
	}
	if p.run.names.pending.Load() && mayBeName(sql) {
		return p.learnNames(ctx)
	}
	return nil
}

// readyBatch is ready for batch b, any of whose statements may be run by a name.
func (p *Pool) readyBatch(ctx context.Context, b *pgx.Batch) error {
	if p.engine.Closed() {
		return errPoolClosed
	}
	if p.run.names.pending.Load() && slices.ContainsFunc(b.QueuedQueries, func(q *pgx.QueuedQuery) bool { return mayBeName(q.SQL) }) {
		return p.learnNames(ctx)
	}
	return nil
}

// mayBeName reports whether sql, sent before the names of the statements the pool's
// AfterConnect hook prepares are known, may be one of them: one word (see oneWord), or a text
// that is not SQL, as a name with a space is ("purge items": pgx takes any string as a name).
// The second asks pg_query, which only the pool's first statements do.
func mayBeName(sql string) bool { return oneWord(sql) || !pattern.Analyze(sql).Parsed }

// learnNames waits until the pool's AfterConnect hook has run on a connection: the names of the
// statements it prepares are then known, and the pool's statements, decided before they take a
// connection, are decided as the texts those names stand for (preparedNames). It takes a
// connection for that, once, and gives it back; its error is the pool's. Only a statement that
// may be run by a name waits for it: one of SQL text takes its own connection, on which the
// hook runs, as pgxpool's first statement does (a second acquisition would run the pool's
// PrepareConn hook twice, and, with an AfterRelease hook, which pgxpool runs after the
// connection went back, could dial a second connection).
func (p *Pool) learnNames(ctx context.Context) error {
	c, err := p.pool.Acquire(ctx) // a new connection: the hook, then preparedNames.learn
	if err != nil {
		return closedPool(err)
	}
	c.Release()
	return nil
}

// Exec runs a statement that returns no rows, once the engine admits it. A refused statement
// returns a [*BlockedError] and nothing is sent.
func (p *Pool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := p.ready(ctx, sql); err != nil {
		return pgconn.CommandTag{}, err
	}
	return p.run.exec(ctx, &p.dest, sql, args)
}

// Query runs a query once the engine admits it. The statement's budget slots are held until
// the rows are closed or read to the end: close them (pgx.CollectRows and the other helpers
// do). A refused query returns a [*BlockedError] (and rows whose Err is the same) and nothing
// is sent.
func (p *Pool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := p.ready(ctx, sql); err != nil {
		return errRows{err: err}, err
	}
	return p.run.query(ctx, &p.dest, sql, args)
}

// QueryRow runs a query that returns at most one row; its error, a [*BlockedError] when it is
// refused, is returned by the row's Scan. As with pgxpool, the row must be scanned: Scan gives
// back the statement's budget slots and the pool's connection.
func (p *Pool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := p.ready(ctx, sql); err != nil {
		return &pgxRow{err: err}
	}
	return p.run.queryRow(ctx, &p.dest, sql, args)
}

// Begin starts a transaction on a connection of the pool. The transaction's statements (Exec,
// Query, QueryRow, SendBatch, CopyFrom, and those of its nested transactions) are controlled
// as the pool's are; see [Pool.BeginTx].
func (p *Pool) Begin(ctx context.Context) (pgx.Tx, error) {
	return p.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx starts a transaction with o. BEGIN, COMMIT and ROLLBACK are not decided (they cost
// the server nothing); the statements in between are, each on the transaction's connection
// (an EXPLAIN in a savepoint), and a refused one is not sent, so the transaction stays usable.
// The transaction's Conn is the *pgx.Conn underneath: statements sent through it bypass
// control. A statement prepared with the transaction's Prepare and run by its name, through
// the transaction or, once it ended, on the pool, is decided as the text it was prepared from.
func (p *Pool) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	t, err := p.pool.BeginTx(ctx, o)
	if err != nil {
		return nil, closedPool(err)
	}
	return &pgxTx{Tx: t, run: p.run, prepared: map[string]string{}}, nil
}

// Ping acquires a connection and pings the server; it is not decided.
func (p *Pool) Ping(ctx context.Context) error { return closedPool(p.pool.Ping(ctx)) }

// Stat returns the pgxpool's statistics.
func (p *Pool) Stat() *pgxpool.Stat { return p.pool.Stat() }

// Config returns a copy of the pgxpool configuration the pool was made with, as pgxpool's
// Config does: changing it changes neither the pool nor the next call's copy. It holds
// pgxpool's settings (connection, pool sizes, hooks), not the traffic-control rules: those
// are in Snapshot and changed with SetConfig.
func (p *Pool) Config() *pgxpool.Config {
	c := p.pool.Config()
	c.AfterConnect = p.afterConnect // the application's, not the one that wraps it
	return c
}

// Reset closes all the pool's connections but leaves the pool open, as pgxpool's Reset does:
// the idle ones at once, those in use when they are released. Use it after an error that
// disrupts every connection (a network interruption, a server restart or failover). It is
// not decided and changes no budget: statements in flight hold their slots until they end as
// usual, and the rules, budgets and learned costs are kept.
func (p *Pool) Reset() { p.pool.Reset() }

// Raw returns the *pgxpool.Pool underneath, for code that needs the pgxpool type itself (a
// library that takes a *pgxpool.Pool or a *pgxpool.Conn). Statements sent through it, or
// through connections acquired from it, bypass traffic control: for LISTEN/NOTIFY, acquire
// with [Pool.Acquire] or [Pool.AcquireFunc] and use [PoolConn.Conn]. Do not close it: close
// the Pool.
func (p *Pool) Raw() *pgxpool.Pool { return p.pool }

// Close closes the pool's connections, waiting for those in use to be released, and stops the
// rules watcher and the health sampler. Statements and batches waiting for capacity (max_wait)
// return [ErrClosed] at once: they hold no connection, and none will be theirs.
func (p *Pool) Close() {
	p.engine.Close() // first: pgxpool's Close waits for the statements running, not for these
	p.pool.Close()
	if err := p.close(); err != nil {
		p.log.Warn("pgtraffic: closing the pool", "error", err) // pgxpool's Close returns nothing
	}
}

// CopyFrom copies rows into table with the COPY protocol, once the engine admits it as the
// COPY statement pgx sends for it (copy <table> ( <columns> ) from stdin binary): tagged
// statement=copy and table=<name>, held to its budgets' slots and buckets, its cost learned per
// table and columns, its fingerprint the one of its text in pg_stat_activity. A refused copy
// returns a [*BlockedError] and reads nothing from src.
func (p *Pool) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if p.engine.Closed() {
		return 0, errPoolClosed
	}
	return p.run.copyFrom(ctx, &p.dest, table, columns, src)
}

// SendBatch sends the batch's statements in one round trip, once the engine admits the batch
// whole: each statement is identified, guarded and costed, and the batch is admitted all or
// nothing against the union of its statements' budgets at the sum of their costs. A refused
// batch sends nothing, and every result (Exec, Query, QueryRow, Close) returns the
// [*BlockedError]. An admitted batch holds its budgets' slots until its results are closed:
// close them.
func (p *Pool) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := p.readyBatch(ctx, b); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return p.run.sendBatch(ctx, &p.dest, b)
}
