package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

// envDSN names an existing server for tests to use instead of a throwaway cluster.
const envDSN = "PGTRAFFIC_TEST_DSN"

// shared is the server of the whole test binary, made on first use.
var shared struct {
	once sync.Once
	srv  *Server
	err  error
}

// Shared returns the server for the whole test binary, started once: the one named by
// PGTRAFFIC_TEST_DSN, else a throwaway cluster. If PostgreSQL is unavailable it skips tb,
// except under CI=true where it fails tb; any other failure to start fails tb. Call [Main]
// from TestMain so that the cluster is stopped when the binary ends.
//
// Under go test -short (make unit: the tests that need no server) it skips tb without looking
// for PostgreSQL, also under CI=true: -short is the caller's explicit request, and CI runs the
// tests without it.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	SkipShort(tb)
	shared.once.Do(func() {
		if dsn := os.Getenv(envDSN); dsn != "" {
			shared.srv, shared.err = external(dsn)
		} else {
			shared.srv, shared.err = Start()
		}
	})
	if shared.err != nil {
		unavailable(tb, shared.err)
	}
	return shared.srv
}

// SkipShort skips tb under go test -short (make unit: the tests that need no server), also
// under CI=true. [Shared] calls it; a test that starts its own server with [Start] calls it
// first, so that -short never starts a cluster and never fails for want of PostgreSQL.
func SkipShort(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("needs PostgreSQL: not run under -short (unit tests only)")
	}
}

// unavailable reports a failure to get a server: a skip when PostgreSQL is simply not
// installed and we are not in CI, a failure otherwise.
func unavailable(tb testing.TB, err error) {
	tb.Helper()
	if errors.Is(err, errUnavailable) && !Required() {
		tb.Skipf("%v (install PostgreSQL or set %s)", err, envDSN)
		return
	}
	tb.Fatal(err)
}

// Required reports whether tests that need PostgreSQL must fail rather than skip when it is
// unavailable: when the environment variable CI is true ("true", "1", ...). [Shared] applies
// it itself; callers of [Start] use it to choose between tb.Fatal and tb.Skip.
func Required() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}

// Main runs the tests, stops the shared throwaway cluster if one was started, and exits with
// the tests' status (failing it if the stop fails).
func Main(m *testing.M) {
	code := m.Run()
	if err := stopShared(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func stopShared() error {
	// Running the Once here means a later Shared call cannot start a cluster nobody stops.
	shared.once.Do(func() { shared.err = errors.New("pgtest: Shared called after Main finished") })
	if shared.srv == nil {
		return nil
	}
	return shared.srv.Stop()
}

// external describes the server named by dsn after checking that it answers, because a
// configured server that is down is an error to report, not a reason to skip.
func external(dsn string) (*Server, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %s: %w", envDSN, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %s: %w", envDSN, err)
	}
	defer conn.Close(context.Background())
	if err := conn.Ping(ctx); err != nil {
		return nil, fmt.Errorf("pgtest: %s: %w", envDSN, err)
	}
	return &Server{DSN: dsn, Host: cfg.Host, Port: int(cfg.Port)}, nil
}

// EnvOrStart returns the server named by PGTRAFFIC_TEST_DSN, or else starts a throwaway cluster
// (printing a line to say so, for the examples that use it). stop stops the throwaway cluster
// and does nothing for an external server.
func EnvOrStart() (dsn string, stop func() error, err error) {
	if dsn := os.Getenv(envDSN); dsn != "" {
		return dsn, func() error { return nil }, nil
	}
	fmt.Println("starting a throwaway PostgreSQL ...")
	srv, err := Start()
	if err != nil {
		return "", nil, err
	}
	return srv.DSN, srv.Stop, nil
}
