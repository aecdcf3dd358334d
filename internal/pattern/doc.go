// Package pattern turns SQL text into an immutable [Pattern]: the facts the
// traffic-control engine needs about a statement before it is sent.
//
// # What a pattern holds
//
// [Analyze] parses the text once with pg_query (the PostgreSQL 16 parser) and
// derives the fingerprint, the normalised text (literals replaced by $n), the
// statement kind, the referenced tables, the telemetry operation and summary,
// and two guard facts: [Pattern.UnsafeWrite] (an UPDATE or DELETE whose WHERE
// does not restrict its target's rows) and [Pattern.Truncate]. Guard facts
// are decided from the parse tree, never by matching strings.
//
// # The require_where rule
//
// A WHERE passes only if it references a column of the target table in a way
// that can be false for some row. Predicates with no reference to the target,
// whatever their form (constants, parameters, functions, casts, subqueries
// that are not correlated with the target), count as unrestricted, and so do
// comparisons of an expression with itself (id = id, t.id = id, id + 0 = id,
// id::int = id::int) and disjunctions of complementary conditions
// (id IS NULL OR id IS NOT NULL). AND restricts if any operand does, OR only
// if every operand does; NOT is read through De Morgan's laws. A condition
// that a three-valued constant folder proves never true (false, 1 = 0: what
// ORMs send for an empty IN list) matches no row and passes. A MERGE is
// unsafe when neither its ON condition nor a WHEN MATCHED ... UPDATE/DELETE
// condition restricts the target.
//
// Limits: an unqualified column is taken to be the target's (UPDATE ... FROM
// and DELETE ... USING may mean another table's); a tautology hidden inside
// an opaque expression (a function, CASE, COALESCE) is not proved; and
// writes inside a DO block or a function body are out of reach, because
// their text is a string that only the server's procedural language parses.
// The guard catches mistakes; it is not a sandbox for hostile SQL.
//
// Text pg_query cannot parse is not an error here: it gets a hash
// fingerprint and kind "other", and goes to the server, which answers with
// its own syntax error, or runs it (a newer server syntax, or
// standard_conforming_strings off, where a backslash escapes a quote).
// Because its WHERE cannot be checked, such a text that may hold an UPDATE,
// DELETE or MERGE has UnsafeWrite set, and one that may hold a TRUNCATE has
// Truncate set: an enforced guard blocks it.
//
// # The cache
//
// [Cache] maps [Key] (the text without leading and trailing comments,
// whitespace and semicolons, so that per-request comments such as a
// traceparent or sqlcommenter tags do not multiply entries) to the shared
// *Pattern. It is bounded in entries and in bytes and evicts with CLOCK; a
// hit takes a read lock on one shard and allocates nothing.
package pattern
