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
			f := openDbfailFront(t, front, dsn, `budgets: [{name: b, mode: enforce, max_concurrent: 2, server_share: 0.9, max_duration: 500ms}]
rules: [{budget: b, match: {app: x}}]`)
			ctx := tagging.With(bg, "app", "x")
			tx := lockTable(t, dsn, "t")
			released := make(chan struct{})
			go func() {
				defer close(released)
				time.Sleep(4 * time.Second)
				tx.Rollback(bg)
			}()
			t0 := time.Now()
			err = f.exec(ctx, "select count(*) from t where a > $1", 1)
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
