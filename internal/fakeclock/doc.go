// Package fakeclock is the one fake clock of pgtraffic's tests: its time moves only when a test
// advances it, and its timers (After) fire when the time passes them. It is injected where the
// code takes a clock (engine.Options, runtime.Options, health.Options, coord.Options), so that
// tests of waits, timeouts and intervals run in virtual time, never sleep, and cannot be made
// flaky by a slow machine.
//
// It imports only the standard library; only tests import it.
package fakeclock
