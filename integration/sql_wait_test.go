package integration

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pgtdriver "github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// db.Close while statements wait for capacity: they return ErrClosed at once, never ErrBadConn.
func TestSQLCloseWhileWaiting(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: b, mode: enforce, max_concurrent: 1, max_wait: 20s, max_queue: 10}
rules:
  - {budget: b, match: {app: x}}
`)
	db.SetMaxOpenConns(8)
	ctx := tagging.With(context.Background(), "app", "x")
	running := make(chan error, 1)
	go func() { _, err := db.ExecContext(ctx, "select pg_sleep(1.5)"); running <- err }()
	if !eventually(5*time.Second, func() bool { return budgetStatus(t, c, "b").InFlight == 1 }) {
		t.Fatal("not running")
	}
	errs := make(chan error, 4)
	for i := range 4 {
		go func() {
			var err error
			switch i {
			case 0:
				_, err = db.ExecContext(ctx, "select 1")
			case 1:
				var rows *sql.Rows
				rows, err = db.QueryContext(ctx, "select 1")
				if err == nil {
					rows.Close()
				}
			case 2:
				tx, e := db.BeginTx(ctx, nil)
				if e != nil {
					err = e
					break
				}
				_, err = tx.ExecContext(ctx, "select 1")
				tx.Rollback()
			case 3:
				var n int
				err = db.QueryRowContext(ctx, "select 1").Scan(&n)
			}
			errs <- err
		}()
	}
	if !eventually(5*time.Second, func() bool { return budgetStatus(t, c, "b").Waiting == 4 }) {
		t.Fatalf("waiting: %+v", budgetStatus(t, c, "b"))
	}
	start := time.Now()
	db.Close()
	for range 4 {
		err := <-errs
		if !errors.Is(err, pgtdriver.ErrClosed) || errors.Is(err, driver.ErrBadConn) {
			t.Errorf("waiting statement after Close: %v", err)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("took %v to answer the waiting statements", d)
	}
	<-running
}

// With no max_queue the queue holds max_concurrent statements: the rest are refused at once.
// The statements run for a second, and their connections are open before they start, so that
// on a loaded machine none arrives after the first ones ended (it would find a slot free).
func TestSQLDefaultMaxQueue(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: b, mode: enforce, max_concurrent: 2, max_wait: 10s, per: tenant}
rules:
  - {budget: b, match: {app: x}}
`)
	db.SetMaxOpenConns(30)
	db.SetMaxIdleConns(30)
	var warm sync.WaitGroup
	for range 20 {
		warm.Go(func() {
			if _, err := db.Exec("select pg_sleep(0.05)"); err != nil { // selects no budget
				t.Error(err)
			}
		})
	}
	warm.Wait()
	var wg sync.WaitGroup
	var ok, blocked atomic.Int64
	start := make(chan struct{})
	for _, tenant := range []string{"a", "b"} {
		ctx := tagging.With(context.Background(), "app", "x", "tenant", tenant)
		for range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, err := db.ExecContext(ctx, "select pg_sleep(1)")
				if err == nil {
					ok.Add(1)
				} else {
					be := asBlocked(t, err)
					if be.Reason != pgtdriver.ReasonConcurrency {
						t.Errorf("%+v", be)
					}
					blocked.Add(1)
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	// Per tenant: 2 run, 2 wait and run, 6 refused.
	if ok.Load() != 8 || blocked.Load() != 12 {
		t.Fatalf("ok %d blocked %d, want 8 and 12", ok.Load(), blocked.Load())
	}
	if b := budgetStatus(t, c, "b"); b.InFlight != 0 || b.Waiting != 0 {
		t.Fatalf("%+v", b)
	}
}

// A small pool (SetMaxOpenConns 1 and 2) with max_wait and a transaction: no deadlock, everything
// completes, no slot leaks.
func TestSQLSmallPoolNoDeadlock(t *testing.T) {
	for _, maxOpen := range []int{1, 2} {
		t.Run(fmt.Sprint(maxOpen), func(t *testing.T) {
			c, db := openRules(t, `
budgets:
  - {name: b, mode: enforce, max_concurrent: 1, max_wait: 5s, max_queue: 20}
rules:
  - {budget: b, match: {app: x}}
`)
			db.SetMaxOpenConns(maxOpen)
			ctx, cancel := context.WithTimeout(tagging.With(context.Background(), "app", "x"), 60*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			var failed atomic.Int64
			for g := range 6 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 10 {
						var err error
						switch (g + i) % 4 {
						case 0:
							_, err = db.ExecContext(ctx, "select pg_sleep(0.005)")
						case 1:
							var tx *sql.Tx
							tx, err = db.BeginTx(ctx, nil)
							if err == nil {
								if _, err = tx.ExecContext(ctx, "select 1"); err == nil {
									_, err = tx.ExecContext(ctx, "select 2")
								}
								if err == nil {
									err = tx.Commit()
								} else {
									tx.Rollback()
								}
							}
						case 2:
							var conn *sql.Conn
							conn, err = db.Conn(ctx)
							if err == nil {
								var n int
								err = conn.QueryRowContext(ctx, "select 1").Scan(&n)
								conn.Close()
							}
						case 3:
							var rows *sql.Rows
							rows, err = db.QueryContext(ctx, "select generate_series(1, 100)")
							if err == nil {
								for rows.Next() {
								}
								err = rows.Err()
								rows.Close()
							}
						}
						if err != nil {
							failed.Add(1)
							t.Errorf("g%d i%d: %v", g, i, err)
						}
					}
				}()
			}
			wg.Wait()
			if b := budgetStatus(t, c, "b"); b.InFlight != 0 || b.Waiting != 0 || b.Blocked != 0 {
				t.Fatalf("%+v", b)
			}
		})
	}
}

// Connector.Check and Wait for batch jobs, per tenant.
func TestSQLCheckWait(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: b, mode: enforce, max_concurrent: 1, per: tenant}
rules:
  - {budget: b, match: {app: x}}
`)
	a := tagging.With(context.Background(), "app", "x", "tenant", "a")
	bb := tagging.With(context.Background(), "app", "x", "tenant", "b")
	if err := c.Check(a); err != nil {
		t.Fatal(err)
	}
	rows, err := db.QueryContext(a, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	be := asBlocked(t, c.Check(a))
	if be.Reason != pgtdriver.ReasonConcurrency {
		t.Fatalf("%+v", be)
	}
	if err := c.Check(bb); err != nil {
		t.Fatalf("tenant b: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(a, 10*time.Second)
		defer cancel()
		done <- c.Wait(ctx)
	}()
	time.Sleep(100 * time.Millisecond)
	rows.Close()
	if err := <-done; err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if b := budgetStatus(t, c, "b"); b.InFlight != 0 {
		t.Fatalf("%+v", b)
	}
}

// After db.Close, Wait returns ErrClosed (README: "Once the Connector (its *sql.DB) is closed it
// returns ErrClosed").
func TestSQLWaitAfterClose(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: b, mode: enforce, max_concurrent: 4}
rules:
  - {budget: b, match: {app: x}}
`)
	db.Close()
	ctx, cancel := context.WithTimeout(tagging.With(context.Background(), "app", "x"), 5*time.Second)
	defer cancel()
	if err := c.Wait(ctx); !errors.Is(err, pgtdriver.ErrClosed) {
		t.Fatalf("Wait after the *sql.DB was closed: %v, want ErrClosed", err)
	}
}
