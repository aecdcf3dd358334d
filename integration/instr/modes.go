package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/XSAM/otelsql"
	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// mode is one driver set-up, measured by the command (make instr) and by the wall-time rounds
// (make wall) alike. Its figures are compared with its base, the raw driver of its front end:
// pgx's stdlib for the database/sql modes, pgxpool for the pgx-native ones.
type mode struct {
	name   string
	base   string
	lib    string // what the statements go through: stdlib, connector, otelsql, pgxpool, pool, otelpgx
	budget bool   // pgtraffic with budgetRules: every statement is costed and admitted
	traced bool   // a recording tracer provider: every statement ends a span
	// control: the base again, on a connection of its own. Its wall-time ratio to the base
	// would be 1 on a perfect machine; how far it strays is the run's own noise (which
	// connection, which backend, where the heap lies), the margin a mode's ratio must clear
	// to mean anything. Instruction counts do not need one (make instr leaves it out).
	control bool
}

var modes = []mode{
	{name: "pgx", base: "pgx", lib: "stdlib"},
	{name: "control", base: "pgx", lib: "stdlib", control: true},
	{name: "pgtraffic", base: "pgx", lib: "connector"},
	{name: "budget", base: "pgx", lib: "connector", budget: true},
	{name: "trace", base: "pgx", lib: "connector", traced: true},
	{name: "otelsql", base: "pgx", lib: "otelsql", traced: true},
	{name: "pgxpool", base: "pgxpool", lib: "pgxpool"},
	{name: "poolcontrol", base: "pgxpool", lib: "pgxpool", control: true},
	{name: "pool", base: "pgxpool", lib: "pool"},
	{name: "poolbudget", base: "pgxpool", lib: "pool", budget: true},
	{name: "pooltrace", base: "pgxpool", lib: "pool", traced: true},
	{name: "otelpgx", base: "pgxpool", lib: "otelpgx", traced: true},
}

func modeNames() string {
	names := make([]string, len(modes))
	for i, m := range modes {
		names[i] = m.name
	}
	return strings.Join(names, ", ")
}

func lookupMode(name string) (mode, error) {
	for _, m := range modes {
		if m.name == name {
			return m, nil
		}
	}
	return mode{}, fmt.Errorf("unknown mode %q (want one of %s)", name, modeNames())
}

// budgetRules selects the budget through the context tag app=instr (see statementContext). The
// limits are far above what one connection can use, so nothing is blocked, but server_share
// makes the budget need a cost prediction and max_concurrent a concurrency slot: the full
// admission path. The health interval is an hour: the server clock reader, which a cost budget
// starts, runs once per interval, not per statement, so its rounds follow the run's length
// under callgrind rather than its statements (as the garbage collector would: GOGC=off). Its
// first round, at start-up, is in both runs and cancels; what a round costs is measured apart
// (integration/PERFORMANCE.md).
const budgetRules = `
health_interval: 1h
budgets:
  - name: instr
    mode: enforce
    max_concurrent: 64
    server_share: 0.5
    burst_limit: 30s
rules:
  - budget: instr
    match: {app: instr}
`

// statementContext is the context of every mode's statements, so that only the driver differs
// between modes: the tag app=instr, which selects the budget modes' budget, over a recording
// span, the parent of the tracing modes' statement spans (otelpgx starts a span only under a
// recording one). End the span when done.
func statementContext() (context.Context, trace.Span) {
	tp, _ := tracerProvider()
	ctx, parent := tp.Tracer("instr").Start(context.Background(), "instr")
	return tagging.With(ctx, "app", "instr"), parent
}

// handle is an opened mode, with one connection to the server.
type handle struct {
	mode   mode
	front  front
	status interface{ Snapshot() driver.Snapshot } // pgtraffic's; nil in the modes without it
	spans  *dropSpans                              // the traced modes' span count; nil in the others
	close  func()
}

// open opens m with one connection (the one session and statement cache every statement
// reuses) on a copy of cfg.
func open(ctx context.Context, m mode, cfg *pgxpool.Config) (*handle, error) {
	cfg = cfg.Copy()
	cfg.MaxConns = 1
	h := &handle{mode: m, close: func() {}}
	var opts []driver.Option
	if m.budget {
		bc, err := driver.ParseConfig([]byte(budgetRules))
		if err != nil {
			return nil, err
		}
		opts = append(opts, driver.WithConfig(bc))
	}
	var tp *sdktrace.TracerProvider
	if m.traced {
		tp, h.spans = tracerProvider()
		opts = append(opts, driver.WithTracerProvider(tp))
	}
	switch m.lib {
	case "stdlib":
		h.sqlDB(stdlib.OpenDB(*cfg.ConnConfig))
	case "connector":
		c, err := driver.NewConnectorFromConfig(cfg.ConnConfig, opts...)
		if err != nil {
			return nil, err
		}
		h.sqlDB(sql.OpenDB(c)) // closing the DB closes the connector
		h.status = c
	case "otelsql":
		h.sqlDB(otelsql.OpenDB(stdlib.GetConnector(*cfg.ConnConfig), otelsql.WithTracerProvider(tp)))
	case "pgxpool", "otelpgx":
		if m.lib == "otelpgx" {
			// One span per statement, as the other tracing modes start: otelpgx would also
			// trace each acquisition of a connection from the pool.
			cfg.ConnConfig.Tracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(tp), otelpgx.WithDisableAcquireTracer())
		}
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		h.front, h.close = pgxFront{p}, p.Close
	case "pool":
		p, err := driver.NewPoolFromConfig(ctx, cfg, opts...)
		if err != nil {
			return nil, err
		}
		h.front, h.close, h.status = pgxFront{p}, p.Close, p
	default:
		return nil, fmt.Errorf("mode %s: unknown library %q", m.name, m.lib)
	}
	if tp != nil {
		closeDB := h.close
		h.close = func() {
			closeDB()
			_ = tp.Shutdown(context.Background())
		}
	}
	return h, nil
}

// sqlDB makes db, with one connection, h's front end.
func (h *handle) sqlDB(db *sql.DB) {
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	h.front, h.close = sqlFront{sqlStatements{db}, db}, func() { db.Close() }
}

// check makes sure that h measured the path its mode claims to, after statements statements
// of patterns query patterns (at least: set-up statements may come on top): the budget modes
// admitted them all and costed them from cached EXPLAINs (one per pattern, and one per
// plan-cache TTL on a slow run), the traced modes ended a span for each, and no mode blocked
// or warned.
func (h *handle) check(statements, patterns int) error {
	name := h.mode.name
	if h.spans != nil && h.spans.ended.Load() < uint64(statements) {
		return fmt.Errorf("%s: %d spans ended for %d statements", name, h.spans.ended.Load(), statements)
	}
	if h.status == nil {
		return nil
	}
	s := h.status.Snapshot()
	c := s.Counters
	if c.Blocked != 0 || c.Warned != 0 {
		return fmt.Errorf("%s: blocked %d, warned %d; want none", name, c.Blocked, c.Warned)
	}
	if !h.mode.budget {
		if c.ExplainCalls != 0 {
			return fmt.Errorf("%s: %d EXPLAIN calls with no budget", name, c.ExplainCalls)
		}
		return nil
	}
	if len(s.Budgets) != 1 || s.Budgets[0].Admitted < uint64(statements) {
		return fmt.Errorf("%s: budgets %+v; want one that admitted every one of %d statements", name, s.Budgets, statements)
	}
	if c.ExplainCalls < uint64(patterns) || c.ExplainCacheHits == 0 || c.ExplainFailures != 0 {
		return fmt.Errorf("%s: statements were not costed (EXPLAIN calls %d, want ≥ %d; cache hits %d; failures %d)",
			name, c.ExplainCalls, patterns, c.ExplainCacheHits, c.ExplainFailures)
	}
	if c.ExplainCalls > uint64(4*patterns)+c.ExplainCacheHits/1000 {
		return fmt.Errorf("%s: %d EXPLAIN calls for %d cache hits; plan costs are not cached", name, c.ExplainCalls, c.ExplainCacheHits)
	}
	return nil
}

// statements is what a workload runs a statement through: a front end, or a transaction of one.
type statements interface {
	// queryInt runs a query of one row of one integer column and returns the integer.
	queryInt(ctx context.Context, sql string, args ...any) (int, error)
	// exec runs a statement that returns no rows and returns the rows it affected.
	exec(ctx context.Context, sql string, args ...any) (int64, error)
}

// front is a mode's front end: a *sql.DB, or a pgx-native pool.
type front interface {
	statements
	begin(ctx context.Context) (tx, error)
}

// tx is a transaction of a front end.
type tx interface {
	statements
	commit(ctx context.Context) error
	rollback(ctx context.Context) error
}

// sqlStatements sends statements through database/sql: q is a *sql.DB or a *sql.Tx.
type sqlStatements struct {
	q interface {
		QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
		ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	}
}

func (s sqlStatements) queryInt(ctx context.Context, sql string, args ...any) (n int, err error) {
	err = s.q.QueryRowContext(ctx, sql, args...).Scan(&n)
	return n, err
}

func (s sqlStatements) exec(ctx context.Context, sql string, args ...any) (int64, error) {
	res, err := s.q.ExecContext(ctx, sql, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

type sqlFront struct {
	sqlStatements
	db *sql.DB
}

func (f sqlFront) begin(ctx context.Context) (tx, error) {
	t, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return sqlTx{sqlStatements{t}, t}, nil
}

type sqlTx struct {
	sqlStatements
	tx *sql.Tx
}

func (t sqlTx) commit(context.Context) error   { return t.tx.Commit() }
func (t sqlTx) rollback(context.Context) error { return t.tx.Rollback() }

// pgxFront sends statements through pgx's native interface: q is a *pgxpool.Pool, a
// *driver.Pool, or a pgx.Tx of either.
type pgxFront struct {
	q interface {
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
		Begin(ctx context.Context) (pgx.Tx, error)
	}
}

func (f pgxFront) queryInt(ctx context.Context, sql string, args ...any) (n int, err error) {
	err = f.q.QueryRow(ctx, sql, args...).Scan(&n)
	return n, err
}

func (f pgxFront) exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := f.q.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

func (f pgxFront) begin(ctx context.Context) (tx, error) {
	t, err := f.q.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return pgxTx{pgxFront{t}, t}, nil
}

type pgxTx struct {
	pgxFront
	tx pgx.Tx
}

func (t pgxTx) commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgxTx) rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

// tracerProvider records every span (AlwaysSample) and drops it when it ends, counting it.
func tracerProvider() (*sdktrace.TracerProvider, *dropSpans) {
	d := new(dropSpans)
	return sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithSpanProcessor(d),
	), d
}

// dropSpans is a span processor that discards every span (export is not what is measured)
// and counts them, so that a run can show that its mode traced.
type dropSpans struct{ ended atomic.Uint64 }

func (*dropSpans) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (d *dropSpans) OnEnd(sdktrace.ReadOnlySpan)                   { d.ended.Add(1) }
func (*dropSpans) Shutdown(context.Context) error                  { return nil }
func (*dropSpans) ForceFlush(context.Context) error                { return nil }
