package integration

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestRulesFileRefusedUnread: the rules file is read only when it is a regular file within the
// size limit. At start a FIFO or a file over WithMaxRulesFileSize makes NewConnector fail at
// once; on a reload a .env file of secrets, a FIFO and an oversized file are each refused (the
// last good rules stay, the secret reaches no log) and the connector still closes.
func TestRulesFileRefusedUnread(t *testing.T) {
	const failsafe = 10 * time.Second // real time; only a blocked reader reaches it
	dsn := pgtest.Shared(t).CreateDatabase(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	unblock := func(path string) { // lets a reader blocked opening a FIFO return
		if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	}
	t.Cleanup(func() { unblock(fifo) })
	start := func(opts ...driver.Option) (*driver.Connector, error) {
		type result struct {
			c   *driver.Connector
			err error
		}
		done := make(chan result, 1)
		go func() {
			c, err := driver.NewConnector(dsn, opts...)
			done <- result{c, err}
		}()
		select {
		case r := <-done:
			return r.c, r.err
		case <-time.After(failsafe):
			unblock(fifo)
			t.Fatal("NewConnector did not return")
			return nil, nil
		}
	}
	if _, err := start(driver.WithRulesFile(fifo)); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("a FIFO as the rules file: %v", err)
	}

	path := filepath.Join(dir, "rules.yaml")
	write := func(content string) {
		t.Helper()
		tmp := filepath.Join(dir, ".rules.tmp")
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	closed := "budgets:\n  - {name: gate, mode: enforce, max_concurrent: 1, per_query_limit: 1us}\nrules:\n  - {budget: gate, match: {app: gated}}\n"
	write(closed)
	if _, err := start(driver.WithRulesFile(path), driver.WithMaxRulesFileSize(int64(len(closed)-1))); err == nil || !strings.Contains(err.Error(), "larger than the limit") {
		t.Fatalf("a file over WithMaxRulesFileSize: %v", err)
	}
	var logs lockedBuffer
	c, err := start(driver.WithRulesFile(path), driver.WithMaxRulesFileSize(1<<10), driver.WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unblock(path) }) // before the connector closes: a blocked reader returns
	db := sql.OpenDB(c)
	if db.Ping() != nil {
		t.Fatal("ping")
	}

	const secret = "hunter2secret"
	failures := c.Snapshot().Counters.ReloadFailures
	refused := func(what string) {
		t.Helper()
		if !eventually(10*time.Second, func() bool { return c.Snapshot().Counters.ReloadFailures > failures }) {
			t.Fatalf("%s was not refused", what)
		}
		failures = c.Snapshot().Counters.ReloadFailures
		if got := c.Snapshot().Budgets; len(got) != 1 || got[0].Name != "gate" {
			t.Fatalf("after %s the budgets in force are %+v; want the last good rules", what, got)
		}
	}
	write("REDIS_URL=redis://:" + secret + "@10.0.0.5:6379/0\nPGPASSWORD=" + secret + "\n")
	refused("a .env file")
	if strings.Contains(logs.String(), secret) {
		t.Fatalf("the log shows the secret:\n%s", logs.String())
	}
	write(closed + strings.Repeat(" ", 1<<10))
	refused("a file over the limit")
	if err := os.Rename(fifo, path); err != nil {
		t.Fatal(err)
	}
	refused("a FIFO")

	ctx, cancel := context.WithTimeout(context.Background(), failsafe)
	defer cancel()
	ctx = tagging.With(ctx, "app", "gated")
	db.ExecContext(ctx, "select 1") // a new pattern may slip under 1us; its history will not
	if _, err := db.ExecContext(ctx, "select 1"); !errors.Is(err, driver.ErrBlocked) {
		t.Fatalf("the last good rules must still block: %v", err)
	}
	closedDone := make(chan struct{})
	go func() { db.Close(); c.Close(); close(closedDone) }()
	select {
	case <-closedDone:
	case <-time.After(failsafe):
		t.Fatal("Close did not return")
	}
}
