package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestPoolExplainConnKilledStatementRunsElsewhere: on driver.NewPool a statement of a new
// pattern under a costed budget takes a connection for its EXPLAIN before anything of the
// caller's is sent. Here that EXPLAIN waits for a migration's lock and its backend is
// terminated (pg_terminate_backend, as an idle-in-lock reaper or an operator does). The
// EXPLAIN fails and is counted; "an internal failure (EXPLAIN error, parse error, Redis) never
// fails or alters the caller's query — it falls back and counts the event". The statement,
// never sent, must not be sent on the connection the EXPLAIN's failure left closed (the caller
// would get pgconn's "conn closed"): the pool gives that connection back and the statement
// runs on another, as database/sql runs it in the very same scenario (pgx reports the closed
// connection as driver.ErrBadConn, and database/sql retries it on a new connection).
func TestPoolExplainConnKilledStatementRunsElsewhere(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	bg := context.Background()
	admin, err := pgx.Connect(bg, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(bg)
	if _, err := admin.Exec(bg, "create table t(a int)"); err != nil {
		t.Fatal(err)
	}
	f := openDbfailFront(t, "pool", dsn, `budgets: [{name: b, mode: enforce, max_concurrent: 2, server_share: 0.9}]
rules: [{budget: b, match: {app: x}}]`)
	ctx := tagging.With(bg, "app", "x")
	tx := lockTable(t, dsn, "t")
	done := make(chan error, 1)
	go func() { done <- f.exec(ctx, "select count(*) from t where a > $1", 1) }()
	var n int
	mustEventually(t, "the EXPLAIN waiting for the lock is terminated", func() bool {
		if err := admin.QueryRow(bg, `select count(*) filter (where pg_terminate_backend(pid)) from pg_stat_activity
			where datname = current_database() and query like 'EXPLAIN%' and pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	time.Sleep(200 * time.Millisecond)
	tx.Rollback(bg)
	var got error
	select {
	case got = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the statement did not return")
	}
	s := f.snap()
	t.Logf("statement: %v; explain calls %d, failures %d", got, s.Counters.ExplainCalls, s.Counters.ExplainFailures)
	if got != nil {
		t.Fatalf("a statement whose EXPLAIN's connection was terminated failed with %T %q; it was never sent, want it run "+
			"on another connection (as database/sql does)", got, got)
	}
	checkDbfailIdle(t, "pool", f.snap)
}
