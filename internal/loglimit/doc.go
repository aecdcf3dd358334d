// Package loglimit rate-limits log lines per key, so that a condition that repeats thousands
// of times a second (a budget refusing under pressure, rows leaked in a loop) logs a line a
// second with how many it suppressed, while the metrics count every one.
//
// It imports only the standard library.
package loglimit
