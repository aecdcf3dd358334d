package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/puddle/v2"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestCloseAnswersStatementWaitingForExplain: a new pattern's first statement EXPLAINs while a
// migration holds its table's lock, and a second statement of the pattern waits for that
// EXPLAIN. Close answers the second with ErrClosed while the lock is still held, as it answers
// the statements waiting in a queue, on both front ends; on database/sql it never runs after
// Close. Once the lock goes, nothing is held.
func TestCloseAnswersStatementWaitingForExplain(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	const rules = `
budgets: [{name: b, mode: enforce, max_concurrent: 4, max_wait: 10s, per_query_limit: 5s}]
rules: [{budget: b, match: {app: x}}]
`
	for _, fr := range []string{"pool", "database/sql"} {
		t.Run(fr, func(t *testing.T) {
			var exec func(ctx context.Context, q string, args ...any) error
			var closeFront func()
			var snap func() driver.Snapshot
			if fr == "pool" {
				p := openSizedPool(t, dsn, 6, driver.WithConfig(poolRules(t, rules)))
				exec = func(ctx context.Context, q string, args ...any) error { _, err := p.Exec(ctx, q, args...); return err }
				closeFront, snap = p.Close, p.Snapshot
			} else {
				c, db := openSizedDB(t, dsn, 6, driver.WithConfig(poolRules(t, rules)))
				exec = func(ctx context.Context, q string, args ...any) error {
					_, err := db.ExecContext(ctx, q, args...)
					return err
				}
				closeFront = func() { c.Close(); db.Close() }
				snap = c.Snapshot
			}
			bg := context.Background()
			table := "close_explain_" + map[string]string{"pool": "pool", "database/sql": "sql"}[fr]
			if err := exec(bg, "create table "+table+" (id int)"); err != nil {
				t.Fatal(err)
			}
			lock := lockTable(t, dsn, table)
			ctx := tagging.With(bg, "app", "x")
			q := "select count(*) from " + table + " where id > $1"
			leader, follower := make(chan error, 1), make(chan error, 1)
			go func() { leader <- exec(ctx, q, 1) }()
			mustEventually(t, "the leader's EXPLAIN waits for the lock", func() bool {
				return waitingOnLocks(t, dsn) >= 1
			})
			go func() { follower <- exec(ctx, q, 2) }()
			time.Sleep(200 * time.Millisecond) // the follower joins the leader's EXPLAIN
			closed := make(chan struct{})
			go func() { closeFront(); close(closed) }() // a Pool's Close waits for the leader's connection
			select {
			case err := <-follower:
				if !errors.Is(err, driver.ErrClosed) {
					t.Errorf("the statement waiting for its pattern's EXPLAIN, at Close: %v, want ErrClosed", err)
				}
			case <-time.After(10 * time.Second):
				lock.Rollback(bg)
				t.Fatalf("the statement waiting for its pattern's EXPLAIN is not answered at Close; "+
					"after the lock went: %v", <-follower)
			}
			lock.Rollback(bg)
			<-leader
			<-closed
			mustEventually(t, "nothing held", func() bool {
				s := snap()
				return s.InFlight == 0 && len(s.Budgets) == 1 && s.Budgets[0].InFlight == 0 && s.Budgets[0].Waiting == 0
			})
		})
	}
}

// TestPoolClosedWhileWaitingForConnection: statements admitted before Close that wait for a
// connection of the pool (all of them held elsewhere) are answered, once a connection comes
// back, with the closed Pool's error, which matches ErrClosed and puddle.ErrClosedPool as its
// other answers do; nothing of theirs ran and nothing is held.
func TestPoolClosedWhileWaitingForConnection(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	p := openSizedPool(t, dsn, 1, driver.WithConfig(poolRules(t, `
budgets: [{name: b, mode: enforce, max_concurrent: 4, max_wait: 10s}]
rules: [{budget: b, match: {app: x}}]
`)))
	bg := context.Background()
	ctx := tagging.With(bg, "app", "x")
	if _, err := p.Exec(ctx, "create table close_pending (a int)"); err != nil {
		t.Fatal(err)
	}
	held, err := p.Raw().Acquire(bg)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	errs := make(chan error, n)
	for range n {
		go func() { _, err := p.Exec(ctx, "insert into close_pending values (1)"); errs <- err }()
	}
	mustEventually(t, "three admitted, waiting for the connection", func() bool {
		s := p.Snapshot()
		return len(s.Budgets) == 1 && s.Budgets[0].InFlight == n
	})
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }() // it waits for the connection held
	mustEventually(t, "the pool closed", func() bool {
		pctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
		defer cancel()
		_, err := p.Exec(pctx, "select 1") // refused unsent once closed
		return errors.Is(err, driver.ErrClosed)
	})
	held.Release()
	<-closed
	for range n {
		err := <-errs
		if !errors.Is(err, driver.ErrClosed) || !errors.Is(err, puddle.ErrClosedPool) {
			t.Errorf("admitted before Close, waiting for a connection: %v, want ErrClosed and puddle.ErrClosedPool", err)
		}
	}
	if s := p.Snapshot(); s.InFlight != 0 || s.Budgets[0].InFlight != 0 {
		t.Errorf("held after Close: %d in flight, budget %d", s.InFlight, s.Budgets[0].InFlight)
	}
}

// waitingOnLocks is how many backends of the database at dsn wait for a lock.
func waitingOnLocks(t *testing.T, dsn string) int {
	t.Helper()
	bg := context.Background()
	conn, err := pgx.Connect(bg, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(bg)
	var n int
	if err := conn.QueryRow(bg, "select count(*) from pg_locks where not granted").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
