// Package pattern turns SQL text into an immutable [Pattern]: the facts the
// traffic-control engine needs about a statement before it is sent.
//
// # What a pattern holds
//
// [Analyze] parses the text once with pg_query (the PostgreSQL 16 parser) and
// derives the fingerprint, the normalised text (literals replaced by $n), the
// statement kind, the referenced tables, the telemetry operation and summary,
// and two guard facts: [Pattern.UnsafeWrite] (an UPDATE or DELETE with no
// WHERE, or with a WHERE that folds to a constant true) and
// [Pattern.Truncate]. Guard facts are decided from the parse tree by a
// three-valued constant folder, never by matching strings.
//
// Text pg_query cannot parse is not an error here: it gets a hash
// fingerprint, kind "other" and no guard facts, and goes to the server, which
// answers with its own syntax error.
//
// # The cache
//
// [Cache] maps [Key] (the text without leading and trailing comments,
// whitespace and semicolons, so that per-request comments such as a
// traceparent or sqlcommenter tags do not multiply entries) to the shared
// *Pattern. It is bounded in entries and in bytes and evicts with CLOCK; a
// hit takes a read lock on one shard and allocates nothing.
package pattern
