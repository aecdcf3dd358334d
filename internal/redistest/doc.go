// Package redistest gives integration tests a real, throwaway redis-server.
//
// It imports only the standard library; only tests import it.
//
// [Start] runs the system's redis-server (Debian's package: /usr/bin/redis-server) on a free
// loopback port with persistence off and its files in a temporary directory; [Server.Stop]
// stops it and removes the directory. Tests that exercise failures pause it
// ([Server.Pause], SIGSTOP), kill it ([Server.Kill], SIGKILL) and start it again on the same
// port with empty memory ([Server.Restart]).
//
//	func TestSomething(t *testing.T) {
//		srv := redistest.Need(t) // a private server, stopped at cleanup
//		client := redis.NewClient(&redis.Options{Addr: srv.Addr})
//		...
//	}
//
// When redis-server is not installed, [Need] skips the test, except when the environment
// variable CI is true: in CI a test that needs Redis must fail rather than pass by skipping.
//
// A test binary that dies without stopping its servers (a panic, a test timeout, SIGKILL)
// does not leak them: each server has a small watcher process that kills it and removes its
// directory when the test process ends, however it ends.
package redistest
