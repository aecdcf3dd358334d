package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestPoolContextEndsDuringExplain: on a deploy every pattern is new, so under a
// budget with a per_query_limit the pool takes a connection and runs an EXPLAIN before the
// statement. EXPLAIN waits for the table's lock like any statement, so while a migration holds
// an ACCESS EXCLUSIVE lock the caller's context can end during it. The caller's context ended:
// as raw pgxpool does, and as pgtraffic's database/sql front end answers the very same
// statement, the error must match context.DeadlineExceeded, so that the application reports
// a timeout (as it does for a statement whose context ends while it waits under max_wait),
// not send the statement on the connection pgx closed when it cancelled the EXPLAIN and return
// pgconn's "conn closed", which reads as a broken connection.
func TestPoolContextEndsDuringExplain(t *testing.T) {
	p, dsn := openPool(t, `budgets: [{name: b, mode: enforce, max_concurrent: 2, per_query_limit: 5s}]
rules: [{budget: b, match: {app: x}}]`)
	raw := openRaw(t, dsn)
	mustExec(t, raw, context.Background(), "create table t (id int)")
	lock, err := raw.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback()
	if _, err := lock.Exec("lock table t in access exclusive mode"); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(tagging.With(context.Background(), "app", "x"), 300*time.Millisecond)
	defer cancel()
	_, err = p.Exec(ctx, "select id from t") // a new pattern: its EXPLAIN waits for the lock
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a pool statement whose context ended while its EXPLAIN waited: %T %v; want an error matching context.DeadlineExceeded", err, err)
	}
}
