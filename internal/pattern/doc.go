// Package pattern turns SQL text into an immutable [Pattern]: the facts the
// traffic-control engine needs about a statement before it is sent.
//
// It imports pg_query_go, protobuf's reflection, internal/guard (a statement's guard facts),
// internal/bounded (identifiers made valid UTF-8, the normalised text cut to its bound) and
// driver/rules/vocab (the statement kinds, how a fingerprint is spelled), and nothing else of
// pgtraffic's.
//
// # What a pattern holds
//
// [Analyze] parses the text once with pg_query (the PostgreSQL 16 parser) and
// derives the fingerprint, the normalised text (literals replaced by $n, cut to
// bounded.QueryLen bytes), the statement kind, the referenced tables, the
// telemetry operation and summary, and, from the same parse tree, the two guard
// facts of package internal/guard: [Pattern.UnsafeWrite] (an UPDATE, DELETE or
// MERGE that does not restrict its target's rows, the require_where rule) and
// [Pattern.Truncate]. Guard facts are decided from the parse tree, never by
// matching strings; the guard package documents what they prove and what
// they do not.
//
// Text pg_query cannot parse is not an error here: it gets a hash
// fingerprint and kind "other", and goes to the server, which answers with
// its own syntax error, or runs it (a newer server syntax, or
// standard_conforming_strings off, where a backslash escapes a quote).
// Because its WHERE cannot be checked, such a text that may hold an UPDATE,
// DELETE or MERGE has UnsafeWrite set, and one that may hold a TRUNCATE has
// Truncate set: an enforced guard blocks it. So has a text pg_query parses
// but a server with standard_conforming_strings off reads otherwise (a
// backslash before a quote ends a string elsewhere), whose other statements
// pg_query does not see. A text nested more than 1,000 levels deep (operators
// chained in one expression, set operations, joins, parentheses) is unparsable
// too, without being given to pg_query: its C code recurses on the thread's
// stack, unchecked, and a deep enough text would kill the process.
//
// # The cache
//
// [Cache] maps [Key] (the text without leading and trailing comments,
// whitespace and semicolons, so that per-request comments such as a
// traceparent or sqlcommenter tags do not multiply entries) to the shared
// *Pattern. It is bounded in entries and in bytes and evicts with CLOCK; a
// hit takes a read lock on one shard and allocates nothing.
package pattern
