package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// swappedRulesFile returns a writer that swaps path's content atomically (write + rename).
func swappedRulesFile(t *testing.T) (path string, write func(string)) {
	t.Helper()
	dir := t.TempDir()
	path = filepath.Join(dir, "rules.yaml")
	n := 0
	write = func(content string) {
		t.Helper()
		n++
		tmp := filepath.Join(dir, fmt.Sprintf(".rules.%d.tmp", n))
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	return path, write
}

// TestDeployFileReloadReachesWaiters: with a watched rules file, statements waiting
// (max_wait) for the slot an open rows holds: a typo'd file is refused (counted, logged with the
// field, last good rules stay, waiters keep waiting); a file that closes the budget
// (max_concurrent: 0) refuses the waiters at once with no retry hint; everything is given back.
func TestDeployFileReloadReachesWaiters(t *testing.T) {
	path, write := swappedRulesFile(t)
	open := "budgets:\n  - {name: b, mode: enforce, max_concurrent: 1, max_wait: 20s, max_queue: 4}\nrules:\n  - {budget: b, match: {app: w}}\n"
	write(open)
	var logs lockedBuffer
	dsn := pgtest.Shared(t).CreateDatabase(t)
	c, err := driver.NewConnector(dsn, driver.WithRulesFile(path), driver.WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	defer db.Close()
	db.SetMaxOpenConns(8)
	ctx := tagging.With(context.Background(), "app", "w")
	rows, err := db.QueryContext(ctx, "select g from generate_series(1, 100000) g")
	if err != nil {
		t.Fatal(err)
	}
	rows.Next()
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := db.ExecContext(ctx, "select 1")
			errs <- err
		}()
	}
	if !eventually(5*time.Second, func() bool { b, _ := budgetNamed(c.Snapshot(), "b"); return b.Waiting == 3 }) {
		t.Fatalf("waiters: %+v", c.Snapshot().Budgets)
	}
	failures := c.Snapshot().Counters.ReloadFailures
	write("budgets:\n  - {name: b, mode: enforce, max_concurent: 0}\nrules:\n  - {budget: b, match: {app: w}}\n")
	if !eventually(10*time.Second, func() bool { return c.Snapshot().Counters.ReloadFailures > failures }) {
		t.Fatal("the typo'd file was not reported")
	}
	if b, _ := budgetNamed(c.Snapshot(), "b"); b.Waiting != 3 || b.InFlight != 1 {
		t.Fatalf("after a refused file the waiters must keep waiting: %+v", b)
	}
	if !contains(logs.String(), "max_concurent") {
		t.Fatalf("log does not name the field:\n%s", logs.String())
	}
	start := time.Now()
	write("budgets:\n  - {name: b, mode: enforce, max_concurrent: 0, max_wait: 20s}\nrules:\n  - {budget: b, match: {app: w}}\n")
	for range 3 {
		select {
		case err := <-errs:
			be := asBlocked(t, err)
			if be.Reason != driver.ReasonConcurrency || be.RetryAfter != 0 {
				t.Errorf("waiter under the closed budget: %+v", be)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a waiter was not decided again by the closing file")
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("closing took %v", d)
	}
	rows.Close()
	reloads := c.Snapshot().Counters.Reloads
	write(open)
	if !eventually(10*time.Second, func() bool {
		b, _ := budgetNamed(c.Snapshot(), "b")
		return c.Snapshot().Counters.Reloads > reloads && b.InFlight == 0 && b.Waiting == 0
	}) {
		t.Fatalf("budget not back to idle: %+v", c.Snapshot().Budgets)
	}
	if _, err := db.ExecContext(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
}

// TestDeployRenamedBudgetWaiters: the budget the waiters wait in is renamed by a reload
// (same limits). Each waiter is decided again under the renamed budget: none hangs, none is
// refused (max_wait is long), and the old name's slot, held by open rows, is released into it.
func TestDeployRenamedBudgetWaiters(t *testing.T) {
	before := "budgets:\n  - {name: old, mode: enforce, max_concurrent: 1, max_wait: 10s, max_queue: 4}\nrules:\n  - {budget: old, match: {app: r}}\n"
	after := "budgets:\n  - {name: new, mode: enforce, max_concurrent: 1, max_wait: 10s, max_queue: 4}\nrules:\n  - {budget: new, match: {app: r}}\n"
	c, db := openRules(t, before)
	db.SetMaxOpenConns(8)
	ctx := tagging.With(context.Background(), "app", "r")
	rows, err := db.QueryContext(ctx, "select g from generate_series(1, 100000) g")
	if err != nil {
		t.Fatal(err)
	}
	rows.Next()
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := db.ExecContext(ctx, "select pg_sleep(0.05)")
			errs <- err
		}()
	}
	if !eventually(5*time.Second, func() bool { b, _ := budgetNamed(c.Snapshot(), "old"); return b.Waiting == 3 }) {
		t.Fatalf("waiters: %+v", c.Snapshot().Budgets)
	}
	setRulesOn(t, c, after)
	for range 3 {
		select {
		case err := <-errs:
			if err != nil {
				t.Errorf("waiter after rename: %v", err)
			}
		case <-time.After(8 * time.Second):
			t.Fatal("a waiter hangs after the budget was renamed")
		}
	}
	rows.Close()
	setRulesOn(t, c, before) // the old name again: its state was kept while its slot was held
	if b, _ := budgetNamed(c.Snapshot(), "old"); b.InFlight != 0 || b.Waiting != 0 {
		t.Fatalf("old budget after its slot was released: %+v", b)
	}
}

// TestDeployReloadStorm: statements under max_concurrent with max_wait while reloads
// flip the limit between 2 and 3, remove and re-add the budget, turn it to warn and back, and
// rename it. No statement hangs, none fails other than with a BlockedError, and when traffic
// stops every budget is idle: no slot leaks, no waiter is left.
func TestDeployReloadStorm(t *testing.T) {
	spec := func(name, mode string, n int) string {
		return fmt.Sprintf("budgets:\n  - {name: %s, mode: %s, max_concurrent: %d, max_wait: 300ms, max_queue: 6}\nrules:\n  - {budget: %s, match: {app: s}}\n", name, mode, n, name)
	}
	configs := []string{
		spec("b", "enforce", 2),
		spec("b", "enforce", 3),
		"budgets:\n  - {name: other, mode: enforce, max_concurrent: 1}\nrules:\n  - {budget: other, match: {app: nobody}}\n",
		spec("b", "enforce", 2),
		spec("b", "warn", 2),
		spec("b", "enforce", 1),
		spec("c", "enforce", 2),
		spec("b", "enforce", 3),
	}
	c, db := openRules(t, configs[0])
	db.SetMaxOpenConns(16)
	ctx, cancel := context.WithTimeout(tagging.With(context.Background(), "app", "s"), 30*time.Second)
	defer cancel()
	var stop atomic.Bool
	var ok, blocked atomic.Int64
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			for !stop.Load() {
				var err error
				if i%2 == 0 {
					var rows *sql.Rows
					rows, err = db.QueryContext(ctx, "select g from generate_series(1, 50) g")
					if err == nil {
						for rows.Next() {
						}
						time.Sleep(2 * time.Millisecond)
						err = rows.Close()
					}
				} else {
					_, err = db.ExecContext(ctx, "select pg_sleep(0.002)")
				}
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, driver.ErrBlocked):
					blocked.Add(1)
				default:
					t.Errorf("statement: %v", err)
					return
				}
			}
		})
	}
	for i := range 120 {
		setRulesOn(t, c, configs[i%len(configs)])
		time.Sleep(5 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatal("statements hung")
	}
	for _, name := range []string{"b", "c"} {
		setRulesOn(t, c, spec(name, "enforce", 3))
		if b, _ := budgetNamed(c.Snapshot(), name); b.InFlight != 0 || b.Waiting != 0 {
			t.Errorf("budget %s after traffic stopped: in_flight %d waiting %d", name, b.InFlight, b.Waiting)
		}
	}
	t.Logf("ok %d, blocked %d", ok.Load(), blocked.Load())
}

// TestDeployLimitNeverExceededAcrossReloads: reloads that only move max_concurrent
// between 2 and 3 (the budget kept): statements observed running at once never exceed 3.
func TestDeployLimitNeverExceededAcrossReloads(t *testing.T) {
	spec := func(n int) string {
		return fmt.Sprintf("budgets:\n  - {name: b, mode: enforce, max_concurrent: %d, max_wait: 200ms}\nrules:\n  - {budget: b, match: {app: l}}\n", n)
	}
	c, db := openRules(t, spec(3))
	db.SetMaxOpenConns(16)
	ctx := tagging.With(context.Background(), "app", "l")
	var running, peak atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			for !stop.Load() {
				rows, err := db.QueryContext(ctx, "select 1")
				if err != nil {
					if !errors.Is(err, driver.ErrBlocked) {
						t.Error(err)
						return
					}
					continue
				}
				n := running.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(time.Millisecond)
				running.Add(-1)
				rows.Close()
			}
		})
	}
	for i := range 100 {
		setRulesOn(t, c, spec(2+i%2))
		time.Sleep(3 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	if p := peak.Load(); p > 3 {
		t.Errorf("%d statements ran at once under max_concurrent <= 3", p)
	}
	if b, _ := budgetNamed(c.Snapshot(), "b"); b.InFlight != 0 {
		t.Errorf("leaked slots: %+v", b)
	}
}

// TestDeployFileDeletedKeepsRules: the rules file deleted keeps the rules in force; a
// new file renamed into place later is applied.
func TestDeployFileDeletedKeepsRules(t *testing.T) {
	path, write := swappedRulesFile(t)
	closed := "budgets:\n  - {name: gate, mode: enforce, max_concurrent: 0}\nrules:\n  - {budget: gate, match: {app: d}}\n"
	write(closed)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	c, err := driver.NewConnector(dsn, driver.WithRulesFile(path))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	defer db.Close()
	ctx := tagging.With(context.Background(), "app", "d")
	if _, err := db.ExecContext(ctx, "select 1"); !errors.Is(err, driver.ErrBlocked) {
		t.Fatalf("closed: %v", err)
	}
	reloads := c.Snapshot().Counters.Reloads
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond)
	if _, err := db.ExecContext(ctx, "select 1"); !errors.Is(err, driver.ErrBlocked) {
		t.Fatalf("after the file was deleted the rules must stay: %v", err)
	}
	if c.Snapshot().Counters.Reloads != reloads {
		t.Fatalf("a deleted file was applied as a reload")
	}
	write("budgets:\n  - {name: gate, mode: enforce, max_concurrent: 1}\nrules:\n  - {budget: gate, match: {app: d}}\n")
	if !eventually(10*time.Second, func() bool { _, err := db.ExecContext(ctx, "select 1"); return err == nil }) {
		t.Fatal("the re-created file was not applied")
	}
}
