package integration

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// sqlTracer records the SQL of every query pgx traces.
type sqlTracer struct {
	mu  sync.Mutex
	sql []string
}

func (r *sqlTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	r.sql = append(r.sql, d.SQL)
	r.mu.Unlock()
	return ctx
}

func (r *sqlTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// tracerRules sample health every 50ms, with a query whose side effect the test sees, and
// have the server clock read for the application's statements.
const tracerRules = `health_interval: 50ms
health_queries: {samples: "select nextval('tracer_samples')"}
budgets:
  - {name: b, mode: enforce, throttle_when: {custom.samples: 1e15}}
  - {name: share, mode: warn, server_share: 0.5}
rules:
  - {budget: b, match: {app: x}}
  - {budget: share, match: {app: x}}
`

// tracedFrontEnd is a front end made with the application's tracer: exec runs a statement of
// the application's, snapshot is its Snapshot.
type tracedFrontEnd struct {
	exec     func(ctx context.Context, sql string) error
	snapshot func() driver.Snapshot
}

// TestPoolTracerSeesOnlyTheApplicationsQueries: NewPoolFromConfig's doc invites a
// pgxpool.Config "adjusted in code (hooks such as AfterConnect, a TLS config, a tracer)", and
// the usual tracer there is otelpgx, one span per query the application sends. design.md says
// the health sampler reads "on its own dedicated connection (never one from the application's
// pool)", every health_interval, which the README advises to oversample; the server clock
// reader reads on one of its own too. Both are made from the application's ConnConfig, but not
// with its Tracer: the application's tracer must not receive a span for every health sample
// and every server-clock read, several a second per instance that the application never sent,
// mixed into its own traces and query metrics (pgtraffic's connections are named by their
// application_name instead).
func TestPoolTracerSeesOnlyTheApplicationsQueries(t *testing.T) {
	testTracerSeesOnlyTheApplicationsQueries(t, func(t *testing.T, dsn string, tr pgx.QueryTracer, cfg *driver.Config) tracedFrontEnd {
		pc, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		pc.ConnConfig.Tracer = tr
		p, err := driver.NewPoolFromConfig(context.Background(), pc, driver.WithConfig(cfg))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return tracedFrontEnd{
			exec:     func(ctx context.Context, sql string) error { _, err := p.Exec(ctx, sql); return err },
			snapshot: p.Snapshot,
		}
	})
}

// TestPoolHookTracerSeesOnlyTheApplicationsQueries: the same for a tracer that the pool's
// BeforeConnect hook sets, as a program that sets what changes per connection there may: the
// hook runs on pgtraffic's own connections too (for a rotating password), but the tracer it
// sets does not stay on them.
func TestPoolHookTracerSeesOnlyTheApplicationsQueries(t *testing.T) {
	testTracerSeesOnlyTheApplicationsQueries(t, func(t *testing.T, dsn string, tr pgx.QueryTracer, cfg *driver.Config) tracedFrontEnd {
		pc, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		pc.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
			cc.Tracer = tr
			return nil
		}
		p, err := driver.NewPoolFromConfig(context.Background(), pc, driver.WithConfig(cfg))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return tracedFrontEnd{
			exec:     func(ctx context.Context, sql string) error { _, err := p.Exec(ctx, sql); return err },
			snapshot: p.Snapshot,
		}
	})
}

// TestConnectorTracerSeesOnlyTheApplicationsQueries: the same for the database/sql front end,
// made with NewConnectorFromConfig from a ConnConfig with a tracer.
func TestConnectorTracerSeesOnlyTheApplicationsQueries(t *testing.T) {
	testTracerSeesOnlyTheApplicationsQueries(t, func(t *testing.T, dsn string, tr pgx.QueryTracer, cfg *driver.Config) tracedFrontEnd {
		cc, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cc.Tracer = tr
		c, err := driver.NewConnectorFromConfig(cc, driver.WithConfig(cfg))
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(c)
		t.Cleanup(func() { db.Close() })
		return tracedFrontEnd{
			exec:     func(ctx context.Context, sql string) error { _, err := db.ExecContext(ctx, sql); return err },
			snapshot: c.Snapshot,
		}
	})
}

func testTracerSeesOnlyTheApplicationsQueries(t *testing.T,
	open func(t *testing.T, dsn string, tr pgx.QueryTracer, cfg *driver.Config) tracedFrontEnd) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	// The test sees, on a connection of its own, that the sampler has run.
	own, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close(context.Background())
	if _, err := own.Exec(context.Background(), "create sequence tracer_samples"); err != nil {
		t.Fatal(err)
	}
	cfg, err := driver.ParseConfig([]byte(tracerRules))
	if err != nil {
		t.Fatal(err)
	}
	tr := &sqlTracer{}
	fe := open(t, dsn, tr, cfg)
	ctx := tagging.With(context.Background(), "app", "x")
	pendingEventually(t, "the sampler has read a sample", func() bool {
		var called bool
		if err := own.QueryRow(context.Background(), "select is_called from tracer_samples").Scan(&called); err != nil {
			t.Fatal(err)
		}
		return called
	})
	pendingEventually(t, "the server clock has been read (or failed to be)", func() bool {
		if err := fe.exec(ctx, "select 1"); err != nil {
			return false // throttled until the first sample
		}
		c := fe.snapshot().Counters
		return c.ServerClockReads+c.ServerClockFailures > 0
	})
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, s := range tr.sql {
		if strings.TrimSpace(s) != "select 1" {
			t.Errorf("the application's tracer saw a query the application never sent: %q", s)
			break
		}
	}
}
