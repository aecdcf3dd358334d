package pgtest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func queryString(t *testing.T, conn *pgx.Conn, sql string) string {
	t.Helper()
	var s string
	if err := conn.QueryRow(context.Background(), sql).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

// startOwn starts a private cluster for a test that disturbs it.
func startOwn(t *testing.T) *Server {
	t.Helper()
	SkipShort(t)
	srv, err := Start()
	if err != nil {
		unavailable(t, err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return srv
}

func TestShared(t *testing.T) {
	srv := Shared(t)
	if again := Shared(t); again != srv {
		t.Fatalf("second Shared = %p, want the first server %p", again, srv)
	}
	conn := connect(t, srv.DSN)
	var one int
	if err := conn.QueryRow(context.Background(), "select $1::int + 1", 0).Scan(&one); err != nil || one != 1 {
		t.Fatalf("select $1::int + 1 = %d, %v; want 1", one, err)
	}
	if got := queryString(t, conn, "select current_user"); got != "postgres" {
		t.Errorf("current_user = %q, want postgres", got)
	}
	if srv.DataDir == "" {
		return // external server: its settings are not ours
	}
	if want := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", srv.Port); srv.DSN != want {
		t.Errorf("DSN = %q, want %q", srv.DSN, want)
	}
	if srv.Host != "127.0.0.1" {
		t.Errorf("Host = %q, want 127.0.0.1", srv.Host)
	}
	settings := []struct{ name, want string }{
		{"fsync", "off"},
		{"synchronous_commit", "off"},
		{"full_page_writes", "off"},
		{"max_connections", "300"},
		{"wal_level", "replica"},
		{"hot_standby", "on"},
		{"listen_addresses", "127.0.0.1"},
		{"unix_socket_directories", srv.DataDir},
		{"server_encoding", "UTF8"},
	}
	for _, s := range settings {
		t.Run(s.name, func(t *testing.T) {
			if got := queryString(t, conn, "show "+s.name); got != s.want {
				t.Errorf("%s = %q, want %q", s.name, got, s.want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(srv.DataDir, logName)); err != nil {
		t.Errorf("server log: %v", err)
	}
}

func TestCreateDatabase(t *testing.T) {
	srv := Shared(t)
	var names []string
	t.Run("create", func(t *testing.T) {
		for range 2 {
			dsn := srv.CreateDatabase(t)
			conn := connect(t, dsn)
			names = append(names, queryString(t, conn, "select current_database()"))
			// An open connection must not stop the drop at cleanup: it is WITH (FORCE).
		}
		if names[0] == names[1] || !strings.HasPrefix(names[0], "pgtest_") {
			t.Fatalf("database names %q: want two distinct pgtest_ names", names)
		}
	})
	conn := connect(t, srv.DSN)
	var left int
	if err := conn.QueryRow(context.Background(),
		"select count(*) from pg_database where datname = any($1)", names).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d of %q still exist after cleanup", left, names)
	}
}

func TestRestart(t *testing.T) {
	srv := startOwn(t)
	conn := connect(t, srv.DSN)
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "create table kept (v int); insert into kept values (42)"); err != nil {
		t.Fatal(err)
	}
	before := queryString(t, conn, "select pg_postmaster_start_time()::text")
	port := srv.Port

	if err := srv.Restart(); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if err := conn.Ping(ctx); err == nil {
		t.Error("a connection from before the restart still works")
	}
	if srv.Port != port {
		t.Errorf("port changed from %d to %d", port, srv.Port)
	}
	conn = connect(t, srv.DSN)
	if after := queryString(t, conn, "select pg_postmaster_start_time()::text"); after == before {
		t.Errorf("postmaster start time unchanged (%s): not restarted", after)
	}
	if got := queryString(t, conn, "select v::text from kept"); got != "42" {
		t.Errorf("kept row = %s, want 42", got)
	}

	root := srv.root
	if err := srv.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Stop, %s: %v; want it removed", root, err)
	}
	if err := srv.Restart(); err == nil {
		t.Error("Restart after Stop succeeded")
	}
	if err := srv.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestStandby(t *testing.T) {
	primary := startOwn(t)
	standby, err := primary.StartStandby()
	if err != nil {
		t.Fatalf("StartStandby: %v", err)
	}
	t.Cleanup(func() {
		if err := standby.Stop(); err != nil {
			t.Errorf("standby Stop: %v", err)
		}
	})
	if standby.Port == primary.Port || standby.DataDir == primary.DataDir {
		t.Fatalf("standby shares port %d or data dir %s with the primary", standby.Port, standby.DataDir)
	}

	pconn := connect(t, primary.DSN)
	ctx := context.Background()
	if _, err := pconn.Exec(ctx, "create table replicated (v text); insert into replicated values ('from primary')"); err != nil {
		t.Fatal(err)
	}
	sconn := connect(t, standby.DSN)
	if got := queryString(t, sconn, "select pg_is_in_recovery()::text"); got != "true" {
		t.Errorf("standby pg_is_in_recovery = %s, want true", got)
	}
	// Replication is asynchronous: poll until the row arrives.
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var v string
		err := sconn.QueryRow(ctx, "select v from replicated").Scan(&v)
		if err == nil {
			if v != "from primary" {
				t.Fatalf("standby row = %q, want %q", v, "from primary")
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("row never reached the standby: %v", err)
		case <-tick.C:
		}
	}
	if _, err := sconn.Exec(ctx, "insert into replicated values ('x')"); err == nil {
		t.Error("write on the standby succeeded")
	}
}

func TestFindBinDir(t *testing.T) {
	tmp := t.TempDir()
	mkBin := func(dir string, names ...string) {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	debian := filepath.Join(tmp, "debian")
	for _, v := range []string{"9.6", "15", "13"} {
		mkBin(filepath.Join(debian, v, "bin"), "initdb", "pg_ctl")
	}
	mkBin(filepath.Join(debian, "99", "bin"), "initdb") // no pg_ctl: ignored
	mkBin(filepath.Join(debian, "beta", "bin"), "initdb", "pg_ctl")

	real := filepath.Join(tmp, "real")
	mkBin(real, "initdb", "pg_ctl")
	linked := filepath.Join(tmp, "linked")
	mkBin(linked)
	if err := os.Symlink(filepath.Join(real, "initdb"), filepath.Join(linked, "initdb")); err != nil {
		t.Fatal(err)
	}
	lonely := filepath.Join(tmp, "lonely") // initdb without pg_ctl anywhere
	mkBin(lonely, "initdb")

	tests := []struct {
		name, path, debian, want string
		unavailable              bool
	}{
		{name: "PATH wins", path: real, debian: debian, want: real},
		{name: "symlink on PATH resolved", path: linked, debian: debian, want: real},
		{name: "initdb without pg_ctl skipped", path: lonely + string(filepath.ListSeparator) + real, debian: debian, want: real},
		{name: "highest Debian version", path: lonely, debian: debian, want: filepath.Join(debian, "15", "bin")},
		{name: "nothing", path: lonely, debian: filepath.Join(tmp, "none"), unavailable: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := findBinDir(tt.path, tt.debian)
			if tt.unavailable {
				if !errors.Is(err, errUnavailable) {
					t.Fatalf("findBinDir = %q, %v; want errUnavailable", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("findBinDir = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// recorder is a testing.TB that records Skip and Fatal instead of ending the test.
type recorder struct {
	testing.TB
	skipped, failed bool
}

func (r *recorder) Helper()              {}
func (r *recorder) Skip(...any)          { r.skipped = true }
func (r *recorder) Skipf(string, ...any) { r.skipped = true }
func (r *recorder) Fatal(...any)         { r.failed = true }

func TestUnavailable(t *testing.T) {
	missing := fmt.Errorf("%w: no initdb", errUnavailable)
	broken := errors.New("pgtest: initdb failed")
	tests := []struct {
		name          string
		ci            string
		err           error
		skip, failure bool
	}{
		{name: "missing outside CI skips", ci: "", err: missing, skip: true},
		{name: "missing in CI fails", ci: "true", err: missing, failure: true},
		{name: "missing with CI=1 fails", ci: "1", err: missing, failure: true},
		{name: "missing with CI=false skips", ci: "false", err: missing, skip: true},
		{name: "broken outside CI fails", ci: "", err: broken, failure: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("CI", tt.ci)
			r := &recorder{TB: t}
			unavailable(r, tt.err)
			if r.skipped != tt.skip || r.failed != tt.failure {
				t.Errorf("skipped=%v failed=%v; want skipped=%v failed=%v", r.skipped, r.failed, tt.skip, tt.failure)
			}
		})
	}
}

// TestSkipShort: -short skips a test needing PostgreSQL, under CI=true too (make unit); without
// -short nothing is skipped before PostgreSQL is looked for.
func TestSkipShort(t *testing.T) {
	t.Setenv("CI", "true")
	short := flag.Lookup("test.short").Value
	was := short.String()
	t.Cleanup(func() { short.Set(was) })
	for _, s := range []bool{false, true} {
		if err := short.Set(strconv.FormatBool(s)); err != nil {
			t.Fatal(err)
		}
		r := &recorder{TB: t}
		SkipShort(r)
		if r.skipped != s {
			t.Errorf("-short=%v: skipped=%v, want %v", s, r.skipped, s)
		}
	}
}

func TestWithDatabase(t *testing.T) {
	tests := []struct{ name, dsn, want string }{
		{"url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "postgres://postgres@127.0.0.1:5432/db1?sslmode=disable"},
		{"url without path", "postgresql://u:p@h:1", "postgresql://u:p@h:1/db1"},
		{"keyword value", "host=h port=1 dbname=postgres", "host=h port=1 dbname=postgres dbname='db1'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := withDatabase(tt.dsn, "db1")
			if err != nil || got != tt.want {
				t.Fatalf("withDatabase = %q, %v; want %q", got, err, tt.want)
			}
			cfg, err := pgx.ParseConfig(got)
			if err != nil || cfg.Database != "db1" {
				t.Fatalf("parsed database = %v, %v; want db1", cfg, err)
			}
		})
	}
}
