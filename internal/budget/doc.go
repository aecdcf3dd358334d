// Package budget is the admission core of pgtraffic: per-budget reverse leaky
// buckets, concurrency limits and per-query limits, checked all-or-nothing
// across every budget a query matches.
//
// It imports nothing of pgtraffic's but the vocabulary, driver/rules/vocab (the reasons it
// refuses for, its default burst window), and no YAML or network library: a plain core that the
// layers above wrap.
//
// # Units
//
// Every cost is a float64 number of execution seconds: the time one backend
// spends on a query. A bucket drains at [Spec.Rate] execution seconds per
// second (server_share × server_cores) and holds at most [Spec.Burst]
// execution seconds of debt (burst_limit).
//
// # Reverse leaky buckets
//
// Admitting a query reserves its predicted cost as debt; debt drains
// continuously and is computed when read, so nothing runs in the background:
//
//	debt(now) = max(0, debt(last) − Rate × (now − last))
//
// A query is refused when debt(now) + cost > Burst. The refusal carries the
// exact wait after which it would fit ([Denial.RetryAfter]); a query whose
// cost exceeds Burst never fits and is refused with no wait that helps (the
// engine may still run it as a probe, at an unknown cost bounded by
// [Budget.MaxCost], when the prediction may be what is wrong). When the query
// completes, [Release] trues the debt up to the measured cost. [Bucket] is
// this arithmetic alone, as a plain value.
//
// # Keys
//
// A budget with a `per` tag keeps a separate bucket and concurrency count for
// each value of that tag (the [Request.Key]). The key table is bounded by
// [Spec.MaxKeys]: adding a key to a full table evicts a state whose debt has
// drained to zero, or else the one that will be empty soonest, in O(log n)
// using a min-heap of the states with nothing in flight, ordered by the time
// each one empties. A state with a query in flight is never evicted, so
// concurrency counts are exact; the table exceeds its bound only while more
// distinct keys than MaxKeys have queries in flight at once, and shrinks back
// as they complete. The state of the empty key "" (a budget without `per`, or
// a query without the tag) is kept apart: never evicted, not counted.
//
// # Pending slots
//
// The pgx-native pool admits a statement before it takes a connection, and the statement keeps
// its slot while it waits for one; a statement that already holds a connection (a
// transaction's, or one that had to EXPLAIN first) is admitted on it. A slot of the first kind
// is pending ([Request.Pending]) until [Connect]: a pending request counts every slot in
// flight against MaxConcurrent, a connected one only the slots of running statements, and
// while its key has pending slots a connected request passes the statements waiting in the
// key's queue. So a statement that holds a connection is never held up by one waiting for a
// connection, perhaps the very one it holds, and the two cannot wait for each other. A
// pending request that connects while more statements run than MaxConcurrent allows (connected
// ones overtook it) gives its slot back at Connect, and its caller admits it again.
//
// # Time
//
// Every operation takes `now` as a parameter; the package starts no
// goroutines and never sleeps. Times that go backwards are treated as no time
// passing.
package budget
