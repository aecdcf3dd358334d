package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// readyTimeout bounds the wait for a started server to accept connections (and, for a
// standby, to be in recovery).
const readyTimeout = 30 * time.Second

// portAttempts is how often a start is retried on a fresh port: the port is free when picked
// but another process may take it before the server binds it.
const portAttempts = 5

// logName is the server log inside the data directory.
const logName = "postgresql.log"

var errExternal = errors.New("pgtest: the server named by PGTRAFFIC_TEST_DSN is not ours to restart or replicate")

// Server is a PostgreSQL server for tests: a throwaway cluster started by this package, or the
// external server named by PGTRAFFIC_TEST_DSN.
//
// The exported fields describe where it listens and do not change, not even across Restart.
// The zero value is not a server; get one from [Shared], [Start] or [Server.StartStandby].
// Methods are safe for concurrent use; Stop, Restart and StartStandby are serialised.
type Server struct {
	DSN     string // superuser connection string for the "postgres" database
	Host    string
	Port    int
	DataDir string // the cluster's data directory; "" for an external server

	tc     *toolchain // nil for an external server
	root   string     // temporary directory holding DataDir; removed by Stop
	reaper *reaper

	mu      sync.Mutex // protects the fields below
	stopped bool
}

// dbSeq numbers the databases made by CreateDatabase so names stay short and readable.
var dbSeq atomic.Int64

// Start starts a new throwaway cluster. The caller must Stop it; a cluster left running is
// stopped and removed when the process ends.
func Start() (*Server, error) {
	tc, err := findToolchain()
	if err != nil {
		return nil, err
	}
	s, err := tc.newServer()
	if err != nil {
		return nil, err
	}
	if _, err := tc.run(s.root, "initdb", "-D", s.DataDir, "-A", "trust", "-U", "postgres",
		"--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
		return nil, errors.Join(err, s.Stop())
	}
	if err := s.boot(false); err != nil {
		return nil, errors.Join(err, s.Stop())
	}
	return s, nil
}

// newServer makes the temporary directory for a cluster, owned by the server's user, and
// starts its reaper. The data directory inside it does not exist yet.
func (tc *toolchain) newServer() (*Server, error) {
	root, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if err := tc.chown(root); err != nil {
		return nil, errors.Join(err, os.RemoveAll(root))
	}
	s := &Server{Host: "127.0.0.1", DataDir: filepath.Join(root, "data"), tc: tc, root: root}
	if s.reaper, err = startReaper(tc, root, s.DataDir); err != nil {
		return nil, errors.Join(err, os.RemoveAll(root))
	}
	return s, nil
}

// boot configures and starts the cluster in s.DataDir on a free port, then waits until it
// accepts connections (and, for a standby, is in recovery).
func (s *Server) boot(standby bool) error {
	var err error
	for range portAttempts {
		var port int
		if port, err = freePort(); err != nil {
			return err
		}
		settings := serverSettings(s.DataDir, port)
		if s.tc.hasLibrary(statStatements) {
			// Loaded, not created: only a database that EnableStatStatements names has the view.
			settings = append(settings, [2]string{"shared_preload_libraries", statStatements})
		}
		if err = appendConf(s.DataDir, settings); err != nil {
			return err
		}
		_, err = s.tc.run(s.root, "pg_ctl", "start", "-D", s.DataDir, "-l", s.logPath(), "-w", "-t", "60")
		if err == nil {
			s.Port = port
			s.DSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
			return s.waitReady(standby)
		}
		if !strings.Contains(logTail(s.logPath()), "Address already in use") {
			break
		}
	}
	return fmt.Errorf("%w\nserver log:\n%s", err, logTail(s.logPath()))
}

// serverSettings are the settings of every cluster. Durability is off because the data is
// thrown away; replication is on so that StartStandby works on any cluster.
func serverSettings(dataDir string, port int) [][2]string {
	return [][2]string{
		{"listen_addresses", "127.0.0.1"},
		{"port", fmt.Sprint(port)},
		// Not the default /var/run/postgresql, which the server user may not be able to write.
		{"unix_socket_directories", dataDir},
		{"fsync", "off"},
		{"synchronous_commit", "off"},
		{"full_page_writes", "off"},
		{"max_connections", "300"},
		{"wal_level", "replica"},
		{"max_wal_senders", "10"},
		{"hot_standby", "on"},
		{"shared_buffers", "128MB"},
	}
}

// appendConf appends settings to postgresql.auto.conf, where a later line overrides an earlier
// one; appending keeps the file's owner and what pg_basebackup -R wrote there.
func appendConf(dataDir string, settings [][2]string) error {
	var b strings.Builder
	b.WriteString("# pgtest\n")
	for _, kv := range settings {
		fmt.Fprintf(&b, "%s = '%s'\n", kv[0], strings.ReplaceAll(kv[1], "'", "''"))
	}
	f, err := os.OpenFile(filepath.Join(dataDir, "postgresql.auto.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	_, err = f.WriteString(b.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	return nil
}

// freePort asks the kernel for a free loopback port. The port is released before the server
// binds it, so boot retries when another process wins the race.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: pick a port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("pgtest: pick a port: %w", err)
	}
	return port, nil
}

// waitReady polls until the server accepts a connection and, for a standby, reports
// pg_is_in_recovery. pg_ctl -w has already waited for startup, so this is normally one round.
func (s *Server) waitReady(standby bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := s.probe(ctx, standby)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: server on port %d not ready after %v: %w\nserver log:\n%s",
				s.Port, readyTimeout, err, logTail(s.logPath()))
		case <-tick.C:
		}
	}
}

func (s *Server) probe(ctx context.Context, standby bool) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var inRecovery bool
	if err := conn.QueryRow(ctx, "select pg_is_in_recovery()").Scan(&inRecovery); err != nil {
		return err
	}
	if inRecovery != standby {
		return fmt.Errorf("pg_is_in_recovery() = %v, want %v", inRecovery, standby)
	}
	return nil
}

func (s *Server) logPath() string { return filepath.Join(s.DataDir, logName) }

// logTail returns the end of a server log for error messages.
func logTail(path string) string {
	const maxTail = 4 << 10
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > maxTail {
		b = b[len(b)-maxTail:]
		if i := strings.IndexByte(string(b), '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return strings.TrimRight(string(b), "\n")
}

// Stop stops a throwaway cluster immediately (no shutdown checkpoint; the data is discarded)
// and removes its directory. It does nothing for an external server or a second time.
func (s *Server) Stop() error {
	if s.tc == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	var errs []error
	// No postmaster.pid means no running server, e.g. when initdb or the start failed.
	if _, err := os.Stat(filepath.Join(s.DataDir, "postmaster.pid")); err == nil {
		if _, err := s.tc.run(s.root, "pg_ctl", "stop", "-D", s.DataDir, "-m", "immediate", "-w"); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(s.root); err != nil {
		errs = append(errs, fmt.Errorf("pgtest: %w", err))
	}
	errs = append(errs, s.reaper.close())
	return errors.Join(errs...)
}

// Restart restarts a throwaway cluster with a fast shutdown; port and data are kept, and
// existing connections are broken. It returns when the server accepts connections again.
func (s *Server) Restart() error {
	if s.tc == nil {
		return errExternal
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return errors.New("pgtest: Restart of a stopped server")
	}
	standby := fileExists(filepath.Join(s.DataDir, "standby.signal"))
	if _, err := s.tc.run(s.root, "pg_ctl", "restart", "-D", s.DataDir, "-m", "fast", "-l", s.logPath(), "-w", "-t", "60"); err != nil {
		return fmt.Errorf("%w\nserver log:\n%s", err, logTail(s.logPath()))
	}
	return s.waitReady(standby)
}

// StartStandby starts a hot standby of a throwaway cluster, streaming from it: a base backup
// taken with pg_basebackup -R, started on its own port. It returns once the standby accepts
// connections and is in recovery. The caller must Stop it.
func (s *Server) StartStandby() (*Server, error) {
	if s.tc == nil {
		return nil, errExternal
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, errors.New("pgtest: StartStandby of a stopped server")
	}
	sb, err := s.tc.newServer()
	if err != nil {
		return nil, err
	}
	if _, err := s.tc.run(sb.root, "pg_basebackup", "-D", sb.DataDir, "-R", "-X", "stream", "-c", "fast",
		"-h", "127.0.0.1", "-p", fmt.Sprint(s.Port), "-U", "postgres"); err != nil {
		return nil, errors.Join(err, sb.Stop())
	}
	// The copy carries the primary's log and socket lock file; neither belongs to the standby.
	stale, _ := filepath.Glob(filepath.Join(sb.DataDir, ".s.PGSQL.*"))
	for _, p := range append(stale, sb.logPath()) {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, errors.Join(fmt.Errorf("pgtest: %w", err), sb.Stop())
		}
	}
	if err := sb.boot(true); err != nil {
		return nil, errors.Join(err, sb.Stop())
	}
	return sb, nil
}

// CreateDatabase creates a database with a unique name on s, to be dropped (WITH (FORCE),
// closing connections left open) when tb's test ends, and returns a DSN for it. Failures are
// fatal to tb.
func (s *Server) CreateDatabase(tb testing.TB) string {
	tb.Helper()
	var suffix [4]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	// The random part keeps names unique among test binaries sharing one external server.
	name := fmt.Sprintf("pgtest_%d_%s", dbSeq.Add(1), hex.EncodeToString(suffix[:]))
	ident := pgx.Identifier{name}.Sanitize()
	if err := s.exec("create database " + ident); err != nil {
		tb.Fatalf("pgtest: create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		if s.isStopped() {
			return // the database went with the cluster
		}
		if err := s.exec("drop database if exists " + ident + " with (force)"); err != nil {
			tb.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	dsn, err := withDatabase(s.DSN, name)
	if err != nil {
		tb.Fatal(err)
	}
	return dsn
}

func (s *Server) isStopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped
}

// execTimeout bounds exec: its connection and its one statement.
const execTimeout = time.Minute

// exec runs one statement on a fresh superuser connection.
func (s *Server) exec(sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), execTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// statStatements is the contrib module that keeps per-query execution statistics.
const statStatements = "pg_stat_statements"

// EnableStatStatements creates the pg_stat_statements extension in the database dsn names (a
// database of s, e.g. from CreateDatabase), so that the database has the view. Every throwaway
// cluster preloads the module when this machine's PostgreSQL has it (Debian's package does);
// without it, or on an external server that does not preload it, it skips tb, or under CI=true
// fails it.
func (s *Server) EnableStatStatements(tb testing.TB, dsn string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), execTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	defer conn.Close(context.Background())
	var loaded bool
	if err := conn.QueryRow(ctx, `select $1 = any(string_to_array(current_setting('shared_preload_libraries'), ', '))`,
		statStatements).Scan(&loaded); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	if !loaded {
		unavailable(tb, fmt.Errorf("%w: the server does not preload %s", errUnavailable, statStatements))
		return
	}
	if _, err := conn.Exec(ctx, "create extension if not exists "+statStatements); err != nil {
		tb.Fatalf("pgtest: create extension %s: %v", statStatements, err)
	}
}

// withDatabase returns dsn with its database replaced, for both URL and keyword/value forms.
func withDatabase(dsn, database string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("pgtest: parse DSN: %w", err)
		}
		u.Path = "/" + database
		u.RawPath = ""
		return u.String(), nil
	}
	// In keyword/value form a later keyword overrides an earlier one.
	quoted := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(database)
	return strings.TrimSpace(dsn) + " dbname='" + quoted + "'", nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
