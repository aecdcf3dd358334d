// Package guard decides, from a statement's pg_query parse tree, the two facts the query
// guards act on: whether a text holds a write that does not restrict the rows of its target
// (require_where) and whether it holds a TRUNCATE (block_truncate). It reads SQL and knows
// nothing of rules, patterns or connections.
//
// It imports pg_query_go and protobuf's reflection, and nothing of pgtraffic's.
//
// # What it proves
//
// An UPDATE or DELETE (at top level, in a CTE, under EXPLAIN ANALYZE, PREPARE or COPY, in any
// statement of the text) is an unsafe write unless its WHERE restricts the target's rows: it
// references a column of the target in a way that can be false for some row, or it is never
// true. A MERGE is unsafe unless its ON condition restricts the target's rows or its WHEN MATCHED
// ... UPDATE/DELETE clauses do between them: each has a condition and their OR restricts (an
// UPDATE where x IS NULL and a DELETE where x IS NOT NULL write every row). Everything else
// counts as unrestricted, whatever its form:
//
//   - no WHERE; constants, parameters, functions, casts and subqueries that are not correlated
//     with the target (WHERE true, WHERE $1 = $1, WHERE now() > '2000-01-01', EXISTS (SELECT 1));
//   - comparisons of an expression with itself, seen through casts, collations, identity
//     arithmetic, a double minus and a subquery that only selects it (id = id, t.id = id,
//     id + 0 = id, -(-id) = id, id::int = id::int, (a, b) = (a, b), id = (SELECT id)), and
//     membership in a list or array that holds it (id IN (id, 5), id = ANY (ARRAY[id]));
//   - disjunctions of complementary conditions (x IS NULL OR x IS NOT NULL, p OR NOT p,
//     x = 1 OR x <> 1, x < 1 OR x >= 1), however they are grouped (p OR (q OR NOT p),
//     p OR NOT (p AND q), (p OR q) OR NOT (p OR q), (p AND q) OR NOT p OR NOT q);
//   - conditions every row meets with itself where the statement or a subquery lists the
//     target's relation again, a plain FROM item that ranges over the written row too (DELETE
//     FROM t USING t AS t2 WHERE t.email = t2.email, a de-duplication without its t.id > t2.id;
//     MERGE INTO t USING t AS s ON t.id = s.id; EXISTS (SELECT 1 FROM t AS t2 WHERE t2.id =
//     t.id); id IN (SELECT id FROM t)): every row has a partner that satisfies them, itself.
//
// AND restricts if any operand does, OR only if every operand does; NOT is read through De
// Morgan's laws, so NOT (id = 5 AND false) does not restrict, and the operands of an OR
// include those of the ORs nested in it. A condition proved never true
// matches no row and passes: false, NULL, 1 = 0 (what ORMs send for an empty IN list), x <> x
// where x is a column, a parameter or a literal (not a call, which may be volatile, nor a cast,
// which may lose what tells two values apart), and AND, OR and NOT of these. Literals are
// compared exactly when both are numbers, or strings compared for equality; any other constant
// (arithmetic, a cast, a string read as a boolean) may be true. A subquery restricts when it is correlated with the target: names its own FROM
// introduces shadow the target's.
//
// Text pg_query cannot parse is judged by its words ([Unparsed]): any UPDATE, DELETE or MERGE
// in it may be a write whose WHERE cannot be checked.
//
// # What it does not prove
//
// An unqualified column is taken to be the target's (UPDATE ... FROM and DELETE ... USING may
// mean another table's). A tautology hidden inside an opaque expression (a function, CASE,
// COALESCE, a cast to boolean) is not proved. A qualified name is taken for a column, though
// PostgreSQL reads t.f as the call f(t) when t has no column f: a volatile f so written makes
// t.f <> t.f true. Writes inside a DO block or a function body (SELECT purge_all()) are out of
// reach: their text is a string that only the server's procedural language parses. The guards catch mistakes; they are no defence against hostile
// SQL, for which privileges are.
package guard
