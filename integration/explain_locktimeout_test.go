package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
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
			f, appDSN, _ := lockedTableFront(t, front, "lock_timeout=500", `budgets: [{name: b, mode: enforce, max_concurrent: 2, server_share: 0.9}]
rules: [{budget: b, match: {app: x}}]`)
			bg := context.Background()
			ctx := tagging.With(bg, "app", "x")
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

// lockedTableFront opens front, under rules, on a new database with a table t that a migration
// holds locked from then on (the returned transaction, rolled back at the test's end at the
// latest). The front end's DSN has param ("name=value") added. It returns the front end and its DSN.
func lockedTableFront(t *testing.T, front, param, rules string) (dbfailFront, string, pgx.Tx) {
	t.Helper()
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
	appDSN := dsn
	if param != "" {
		appDSN = dsn + "&" + param
		if !contains(dsn, "?") {
			appDSN = dsn + "?" + param
		}
	}
	f := openDbfailFront(t, front, appDSN, rules)
	return f, appDSN, lockTable(t, dsn, "t")
}

// TestMaxDurationBoundsExplainLockWait: max_duration is "a statement_timeout, per budget,
// applied by the client to the statements its rules select" (README, FAQ), the incident tool
// for statements that hang. A migration holds a table's lock for 4 s; a statement of a new
// pattern under a budget with max_duration: 500ms (and a server_share, so that it is
// EXPLAINed first) must not hang for the lock in its EXPLAIN: a server statement_timeout of
// 500ms would cut it, EXPLAIN included, and so does max_duration. It is answered as a
// statement cut off by max_duration, and once the lock is gone the same statement runs.
func TestMaxDurationBoundsExplainLockWait(t *testing.T) {
	for _, front := range []string{"pool", "sql"} {
		t.Run(front, func(t *testing.T) {
			f, _, tx := lockedTableFront(t, front, "", `budgets: [{name: b, mode: enforce, max_concurrent: 2, server_share: 0.9, max_duration: 500ms}]
rules: [{budget: b, match: {app: x}}]`)
			bg := context.Background()
			ctx := tagging.With(bg, "app", "x")
			released := make(chan struct{})
			go func() {
				defer close(released)
				time.Sleep(4 * time.Second)
				tx.Rollback(bg)
			}()
			t0 := time.Now()
			err := f.exec(ctx, "select count(*) from t where a > $1", 1)
			took := time.Since(t0)
			s := f.snap()
			t.Logf("outcome %v after %v; explain calls %d failures %d", err, took, s.Counters.ExplainCalls, s.Counters.ExplainFailures)
			if took > 2*time.Second {
				t.Fatalf("max_duration 500ms: a statement of a new pattern on a locked table returned after %v (%v), "+
					"held for the lock by its EXPLAIN", took, err)
			}
			if !errors.Is(err, driver.ErrOverrun) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a statement whose EXPLAIN ran past max_duration: %v, want an error matching driver.ErrOverrun and context.DeadlineExceeded", err)
			}
			<-released
			if err := f.exec(ctx, "select count(*) from t where a > $1", 1); err != nil {
				t.Fatalf("the same statement once the lock is gone: %v", err)
			}
			checkDbfailIdle(t, "after the EXPLAIN cut off by max_duration", f.snap)
		})
	}
}
