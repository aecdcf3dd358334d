package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestSQLWaiterConnClosedByServerRunsElsewhere: on database/sql a statement waiting for
// capacity (max_wait) holds the connection database/sql handed it (README). The server closes
// idle sessions (idle_session_timeout, here 1 s; a proxy's or firewall's idle cut-off does the
// same): the waiting statement's session is idle for the 2 s it waits, and the server
// terminates it. Once admitted, the statement must not be sent on the dead connection (the
// caller would get "FATAL: terminating connection due to idle-session timeout (SQLSTATE
// 57P05)"): without pgtraffic that cannot happen (pgx's stdlib checks a connection idle for
// more than a second in ResetSession before database/sql hands it out, and a closed one is
// retried on another connection as driver.ErrBadConn), and with driver.NewPool, whose waiting
// statements hold no connection, the same statement runs. The connection is checked after the
// wait and, dead, answered as driver.ErrBadConn: database/sql runs the statement on another.
func TestSQLWaiterConnClosedByServerRunsElsewhere(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	bg := context.Background()
	appDSN := withIdleTimeout(dsn, 1000)
	f := openDbfailFront(t, "sql", appDSN, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 30s}]
rules: [{budget: b, match: {app: x}}]`)
	ctx := tagging.With(bg, "app", "x")
	if err := f.exec(ctx, "select pg_sleep($1::float8)", 0.001); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.exec(ctx, "select pg_sleep($1::float8)", 2.5) }()
	mustEventually(t, "the first statement in flight", func() bool { return f.snap().InFlight == 1 })
	t0 := time.Now()
	err := f.exec(ctx, "select pg_sleep($1::float8)", 0.01)
	waited := time.Since(t0)
	first := <-done
	t.Logf("waiter: %v after %v; first: %v", err, waited, first)
	if first != nil {
		t.Fatal(first)
	}
	if err != nil {
		t.Fatalf("a statement that waited %v for its slot failed with %q: sent on the connection the server closed while it waited",
			waited.Round(time.Millisecond), err)
	}
}

// TestPoolWaiterConnClosedByServerRunsElsewhere: on driver.NewPool a statement of a pattern
// not yet costed, under a budget with per_query_limit, takes a connection for its EXPLAIN and,
// when it must then wait (max_wait), "waits holding it" (README). The server closes the idle
// session (idle_session_timeout 1 s) during the 2 s wait. The connection was pgtraffic's
// choice, not the caller's, and nothing of the caller's had been sent on it: pgxpool itself
// would have handed out a live one (it checks a connection idle for more than a second before
// handing it out). So once admitted the statement must not be sent on the dead connection (the
// caller would get "FATAL: terminating connection due to idle-session timeout (SQLSTATE
// 57P05)"): the connection is checked after the wait, given back, and the statement runs on
// another.
func TestPoolWaiterConnClosedByServerRunsElsewhere(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	bg := context.Background()
	appDSN := withIdleTimeout(dsn, 1000)
	f := openDbfailFront(t, "pool", appDSN, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 30s, per_query_limit: 20s}]
rules: [{budget: b, match: {app: x}}]`)
	ctx := tagging.With(bg, "app", "x")
	if err := f.exec(ctx, "select pg_sleep($1::float8)", 0.001); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.exec(ctx, "select pg_sleep($1::float8)", 2.5) }()
	mustEventually(t, "the first statement in flight", func() bool { return f.snap().InFlight == 1 })
	t0 := time.Now()
	err := f.exec(ctx, "select 1 + $1::int", 1) // a new pattern: EXPLAINed on its connection, then waits holding it
	waited := time.Since(t0)
	first := <-done
	t.Logf("waiter: %v after %v; first: %v", err, waited, first)
	if first != nil {
		t.Fatal(first)
	}
	if err != nil {
		t.Fatalf("a statement that waited %v for its slot, holding the connection it EXPLAINed on, failed with %q: "+
			"sent on the connection the server closed while it waited", waited.Round(time.Millisecond), err)
	}
}

// TestPoolReadmittedConnClosedByServerRunsElsewhere: on driver.NewPool a statement admitted
// before its connection, whose slot a statement on a held connection (a PoolConn) overtook
// while it waited for the pool, is admitted again on the connection it then took, and waits
// there for room (max_wait) holding it (README). The server closes that idle session (its
// idle_session_timeout 1 s) during the 1.5 s wait. The connection was pgtraffic's choice and
// nothing had been sent on it, so once admitted the statement must not be sent there (the
// caller would get "FATAL: terminating connection due to idle-session timeout (SQLSTATE
// 57P05)"): the connection is checked after the wait, given back, and the statement is decided
// again and runs on another. It is one call of the application's: one span, ended once
// without an error, not a failed span beside the one that ran.
func TestPoolReadmittedConnClosedByServerRunsElsewhere(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	p := pendingPool(t, 2, poolOneSlot, driver.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))))
	ctx := pendingCtx
	c1, err := p.Acquire(ctx) // the overtaker's
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Release()
	raw, err := p.Raw().Acquire(ctx) // the one the statement will wait on
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Exec(ctx, "set idle_session_timeout = 1000"); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() { _, err := p.Exec(ctx, "select 1"); res <- err }()
	pendingEventually(t, "pending", func() bool { return poolBudget(t, p, "b").InFlight == 1 })
	rows, err := c1.Query(ctx, "select generate_series(1, 3)") // overtakes the pending slot
	if err != nil {
		t.Fatal(err)
	}
	raw.Release()
	pendingEventually(t, "re-admission waits", func() bool {
		return poolBudget(t, p, "b").Waiting == 1 && p.Stat().AcquiredConns() == 2
	})
	time.Sleep(1500 * time.Millisecond) // the waiter's connection idle past its timeout
	rows.Close()
	c1.Release()
	t0 := time.Now()
	select {
	case err := <-res:
		t.Logf("the statement ended %v after the overtaker: %v", time.Since(t0), err)
		if err != nil {
			t.Fatalf("a statement admitted again on its connection after a 1.5 s wait for room failed with %q: "+
				"sent on the connection the server closed while it waited", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the statement waiting for room on its connection never ended")
	}
	poolHoldsNothing(t, p, "after the statement ran elsewhere")
	var stmt tracetest.SpanStubs // the overtaker's span aside
	for _, sp := range spans.GetSpans() {
		if !strings.Contains(spanAttrText(sp.Attributes), "generate_series") {
			stmt = append(stmt, sp)
		}
	}
	wantOneSpanEach(t, stmt, 1, "")
}

// TestSQLShortWaitConnClosedByServerRunsElsewhere: as TestSQLWaiterConnClosedByServerRunsElsewhere,
// for a wait of under a second (the README's max_wait: 200ms is one): the server closes the
// waiting statement's idle session (idle_session_timeout 300 ms) during its wait of about 0.6 s.
// Once admitted, the statement must not be sent on the dead connection: the connection is
// checked after a wait of a tenth of a second or more, and, dead, answered as
// driver.ErrBadConn, on which database/sql runs the statement on another connection. It was
// checked only after a second's wait, as pgx's stdlib checks one idle for a second.
func TestSQLShortWaitConnClosedByServerRunsElsewhere(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	bg := context.Background()
	appDSN := withIdleTimeout(dsn, 300)
	f := openDbfailFront(t, "sql", appDSN, `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 5s}]
rules: [{budget: b, match: {app: x}}]`)
	ctx := tagging.With(bg, "app", "x")
	for round := range 3 {
		done := make(chan error, 1)
		go func() { done <- f.exec(ctx, "select pg_sleep($1::float8)", 0.6) }()
		mustEventually(t, "the first statement in flight", func() bool { return f.snap().InFlight == 1 })
		err := f.exec(ctx, "select pg_sleep($1::float8)", 0.01)
		if first := <-done; first != nil {
			t.Fatal(first)
		}
		if err != nil {
			t.Fatalf("round %d: a statement that waited under a second for its slot failed with %q: sent on the connection the server closed while it waited",
				round, err)
		}
	}
}

// withIdleTimeout is dsn with the server's idle_session_timeout set to ms milliseconds for its
// sessions: the server closes a session idle that long.
func withIdleTimeout(dsn string, ms int) string {
	sep := "&"
	if !contains(dsn, "?") {
		sep = "?"
	}
	return fmt.Sprintf("%s%sidle_session_timeout=%d", dsn, sep, ms)
}
