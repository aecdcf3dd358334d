// Package integration holds pgtraffic's end-to-end tests and benchmarks: the driver and the
// pool against a real PostgreSQL and, for shared budgets, a real redis-server, never a mock.
//
// Its tests may import every package of the module, the libraries pgtraffic is measured
// against, and internal/pgtest and internal/redistest for their throwaway servers. It has no
// code of its own outside its tests.
package integration
