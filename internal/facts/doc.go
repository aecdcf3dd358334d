// Package facts checks, in its tests, the rules that keep the module's code in one shape: each
// fact (a reason string, a health metric name, a default) is spelled as a literal in one place
// alone, and each package imports only what its layer may (the layering of the design: the
// public config imports nothing under internal/, the vocabulary is a leaf, the budget core
// imports nothing of pgtraffic's but the vocabulary, and only the database/sql front end imports
// database/sql/driver and pgx's stdlib), and each package's doc.go names what it imports; no
// mutex is held across I/O, a compile, a wait or the application's code (a log handler,
// telemetry); and every test takes its fake time from internal/fakeclock. It holds no other
// code.
//
// It imports only the standard library; its tests read the module's source and run go list.
package facts
