// Package pgtest gives integration tests a real PostgreSQL server.
//
// It imports pgx, to set a server up, and nothing of pgtraffic's; only tests and measuring tools
// import it.
//
// By default it starts a throwaway cluster from the system's own PostgreSQL binaries
// (initdb, pg_ctl): a fresh data directory in a temporary directory, a free loopback port,
// trust authentication for the superuser "postgres", and durability switched off because the
// data dies with the test. When the environment variable PGTRAFFIC_TEST_DSN is set, tests use
// that server instead and nothing is started.
//
// # Usage
//
// A test binary shares one server, started on first use and stopped when the binary ends:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		srv := pgtest.Shared(t)
//		dsn := srv.CreateDatabase(t) // a private database, dropped at cleanup
//		...
//	}
//
// Tests that disturb the server (restart it, replicate from it) start their own with [Start]
// and stop it with [Server.Stop].
//
// # Finding PostgreSQL
//
// The binaries are taken from the directory holding the initdb found on PATH (symlinks
// resolved), else from the highest-versioned /usr/lib/postgresql/*/bin (the Debian layout).
// PostgreSQL refuses to run as root, so when the test runs as root every server binary runs as
// the "postgres" user through runuser(1), and the temporary directory is given to that user.
//
// When no binaries are found, [Shared] skips the test, except when the environment variable CI
// is true: in CI a test that needs PostgreSQL must fail rather than pass by skipping. Under
// go test -short (make unit) it skips the test without looking, also in CI: that is the one
// way to leave out the tests that need a server. Tests that call [Start] themselves call
// [SkipShort] first, and use [Required] to choose between failing and skipping.
//
// # Clean-up
//
// [Server.Stop] stops the cluster (pg_ctl stop -m immediate) and removes its directory. A
// test binary that dies without stopping its clusters (a panic, a test timeout, os.Exit) does
// not leak them: each throwaway cluster has a small watcher process that stops and removes it
// when the test process ends, however it ends.
package pgtest
