package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestFailedExplainDoesNotDoubleLockTimeout: an application sets lock_timeout (here 500ms, in
// its DSN) so that no statement waits longer than that for a lock, as is done where migrations
// take locks. A new pattern under a costed budget is EXPLAINed first on its connection; the
// EXPLAIN waits for the table's lock and the server cancels it at the lock_timeout. Sent, the
// statement would wait for the lock a second time: it is answered with the server's error
// instead, so it fails within about one lock_timeout, as raw pgx on the same DSN does in the
// same run, on both front ends.
func TestFailedExplainDoesNotDoubleLockTimeout(t *testing.T) {
	for _, front := range []string{"pool", "sql"} {
		t.Run(front, func(t *testing.T) {
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
			appDSN := dsn + "&lock_timeout=500"
			if !contains(dsn, "?") {
				appDSN = dsn + "?lock_timeout=500"
			}
			f := openDbfailFront(t, front, appDSN, `budgets: [{name: b, mode: enforce, max_concurrent: 2, server_share: 0.9}]
rules: [{budget: b, match: {app: x}}]`)
			ctx := tagging.With(bg, "app", "x")
			lockTable(t, dsn, "t") // a migration holds the table's lock
			rawConn, err := pgx.Connect(bg, appDSN)
			if err != nil {
				t.Fatal(err)
			}
			defer rawConn.Close(bg)
			t0 := time.Now()
			_, rawErr := rawConn.Exec(bg, "select count(*) from t where a > $1", 1)
			rawTook := time.Since(t0)
			t0 = time.Now()
			err = f.exec(ctx, "select count(*) from t where a > $1", 1)
			took := time.Since(t0)
			s := f.snap()
			t.Logf("raw pgx: %v in %v; pgtraffic: %v in %v; explain calls %d, failures %d", rawErr, rawTook, err, took,
				s.Counters.ExplainCalls, s.Counters.ExplainFailures)
			if err == nil || rawErr == nil {
				t.Fatalf("the statement on a locked table did not fail at its lock_timeout: raw %v, pgtraffic %v", rawErr, err)
			}
			if ratio := took.Seconds() / rawTook.Seconds(); ratio > 1.5 {
				t.Fatalf("lock_timeout 500ms: the statement failed after %v through pgtraffic, %.2f× raw pgx's %v: "+
					"the failed EXPLAIN waited out the lock_timeout, then the statement waited for it again", took, ratio, rawTook)
			}
		})
	}
}
