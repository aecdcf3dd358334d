package guard

import (
	"strings"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v5"
)

// guardCases are the require_where guard's verdicts: an UPDATE/DELETE whose
// WHERE is missing or does not restrict its target's rows is unsafe, everywhere
// in the text.
var guardCases = []struct {
	sql              string
	unsafe, truncate bool
}{
	// No WHERE.
	{"DELETE FROM t", true, false},
	{"UPDATE t SET a = 1", true, false},
	{"delete from public.t;", true, false},
	{"UPDATE t SET a = 1 FROM u", true, false},
	{"DELETE FROM t USING u", true, false},
	{"UPDATE t SET a = 1 RETURNING *", true, false},
	// Constant-true WHERE.
	{"DELETE FROM t WHERE true", true, false},
	{"DELETE FROM t WHERE 1 = 1", true, false},
	{"UPDATE t SET a = 1 WHERE 0=0", true, false},
	{"DELETE FROM t WHERE 'a' = 'a'", true, false},
	{"DELETE FROM t WHERE NOT false", true, false},
	{"DELETE FROM t WHERE 1 IS NOT NULL", true, false},
	{"DELETE FROM t WHERE x = x", true, false},
	{"DELETE FROM t WHERE t.x = t.x", true, false},
	{"DELETE FROM t WHERE id = 5 OR 1 = 1", true, false},
	{"DELETE FROM t WHERE id = id AND true", true, false},
	{"DELETE FROM t WHERE true AND true", true, false},
	{"DELETE FROM t WHERE 't'::boolean", true, false},
	{"DELETE FROM t WHERE CAST('yes' AS bool)", true, false},
	{"DELETE FROM t WHERE 1 < 2", true, false},
	{"DELETE FROM t WHERE NULL IS NULL", true, false},
	{"DELETE FROM t WHERE (((true)))", true, false},
	{"DELETE FROM t WHERE 1::boolean", true, false},
	{"DELETE FROM t WHERE 'true'", true, false},
	{"DELETE FROM t WHERE 2 + 2 = 4", true, false},
	{"DELETE FROM t WHERE '1' = 1", true, false},
	{"DELETE FROM t WHERE 1 IN (1, 2)", true, false},
	{"DELETE FROM t WHERE true IS TRUE", true, false},
	{"DELETE FROM t WHERE NOT (1 <> 1)", true, false},
	{"DELETE FROM t WHERE x IS NOT DISTINCT FROM x", true, false},
	{"DELETE FROM t WHERE 1 IS DISTINCT FROM 2", true, false},
	{"DELETE FROM t WHERE 1.5 >= 1.50", true, false},
	{"DELETE FROM t WHERE -1 < 0", true, false},
	{"UPDATE t SET a = 1 WHERE x = x OR a = $1", true, false},
	// No reference to the target, whatever the form, is unrestricted.
	{"DELETE FROM t WHERE coalesce(true, false)", true, false},
	{"DELETE FROM t WHERE (SELECT true)", true, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1)", true, false},
	{"DELETE FROM t WHERE 'a' LIKE '%'", true, false},
	{"DELETE FROM t WHERE 1 BETWEEN 0 AND 2", true, false},
	{"DELETE FROM t WHERE 1 = ANY('{1}'::int[])", true, false},
	{"DELETE FROM t WHERE CASE WHEN true THEN true END", true, false},
	{"DELETE FROM t WHERE (1, 2) = (1, 2)", true, false},
	{"DELETE FROM t WHERE 'a' < 'b'", true, false},
	{"DELETE FROM t WHERE 1 = 1.0::float8", true, false},
	{"DELETE FROM t WHERE 10 % 3 = 1", true, false},
	{"DELETE FROM t WHERE length('') = 0", true, false},
	{"DELETE FROM t WHERE true::text::bool", true, false},
	{"DELETE FROM t WHERE current_user = current_user", true, false},
	{"DELETE FROM t WHERE 1e999999999 > 0", true, false},
	{"DELETE FROM t WHERE 'maybe'::boolean", true, false},
	{"DELETE FROM t WHERE $1", true, false},
	{"DELETE FROM t WHERE $1 = $1", true, false},
	{"DELETE FROM t WHERE now() > '2000-01-01'", true, false},
	{"DELETE FROM t WHERE random() < 2", true, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1 FROM u)", true, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.active)", true, false},
	{"DELETE FROM t WHERE EXISTS (SELECT t.id)", true, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1 FROM u ORDER BY t.id)", true, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1 FROM u GROUP BY t.id)", true, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1 FROM u WHERE t.id = t.id)", true, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1 FROM t WHERE t.id = 5)", true, false}, // the inner t
	// An unqualified column inside a subquery with a FROM of its own is taken to be the
	// subquery's, as PostgreSQL takes it when its table has one: u.id = id may be u.id = u.id.
	{"DELETE FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.id = uid)", true, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.id = t.uid OR true)", true, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.x = 1 OR t.id = 5)", true, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.x = 1 AND (t.id = 5 OR true))", true, false},
	{"DELETE FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.id = t.uid AND false)", true, false},
	{"DELETE FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.id = t.uid AND u.x <> u.x)", true, false},
	{"DELETE FROM t WHERE (id = 5 AND id < id) IS NOT TRUE", true, false},
	{"DELETE FROM t USING u WHERE u.x = 5", true, false},
	{"UPDATE t SET a = 1 FROM u WHERE u.id = 5", true, false},
	{"DELETE FROM t AS x WHERE t.id = 5", true, false}, // t is not x's name once aliased
	{"DELETE FROM t WHERE other.id = 5", true, false},
	// Comparisons of a target column with itself, and complementary pairs.
	{"DELETE FROM t WHERE t.id = id", true, false},
	{"DELETE FROM t WHERE id + 0 = id", true, false},
	{"DELETE FROM t WHERE x = x + 0", true, false},
	{"DELETE FROM t WHERE id::int = id::int", true, false},
	{"DELETE FROM t WHERE id IS NOT NULL OR id IS NULL", true, false},
	{"DELETE FROM t WHERE t.x = x", true, false},
	{"DELETE FROM t WHERE public.t.id = t.id", true, false},
	{"DELETE FROM t AS x WHERE x.id = id", true, false},
	{"DELETE FROM t WHERE id * 1 >= id - 0", true, false},
	{"DELETE FROM t WHERE (id, a) = (id, a)", true, false},
	{"DELETE FROM t WHERE id - id = 0", true, false},
	{"DELETE FROM t WHERE id * 0 = 0", true, false},
	{"DELETE FROM t WHERE lower(name) = lower(name)", true, false},
	{"DELETE FROM t WHERE name LIKE name", true, false},
	{"DELETE FROM t WHERE id IN (id, 5)", true, false},
	{"DELETE FROM t WHERE id BETWEEN id AND id", true, false},
	{"DELETE FROM t WHERE active OR NOT active", true, false},
	{"DELETE FROM t WHERE NOT active OR active", true, false},
	{"DELETE FROM t WHERE id = 5 OR id <> 5", true, false},
	{"DELETE FROM t WHERE id < 5 OR id >= 5", true, false},
	{"DELETE FROM t WHERE id < 5 OR 5 <= id", true, false},
	{"DELETE FROM t WHERE a IS DISTINCT FROM 1 OR a IS NOT DISTINCT FROM 1", true, false},
	{"DELETE FROM t WHERE active IS TRUE OR active IS NOT TRUE", true, false},
	{"DELETE FROM t WHERE id = 5 OR true", true, false},
	{"DELETE FROM t WHERE id = 5 OR $1", true, false},
	{"DELETE FROM t WHERE NOT (id = 5 AND false)", true, false},
	{"DELETE FROM t WHERE NOT (NOT (id IS NULL) AND NOT (id IS NOT NULL))", true, false},
	{"DELETE FROM t WHERE (id = id) = true", true, false},
	{"DELETE FROM t WHERE (id = 5 AND false) = false", true, false},
	{"DELETE FROM t WHERE (id IS NULL OR id IS NOT NULL) IS TRUE", true, false},
	// Literals compared exactly: a true comparison beside a restricting one is still refused.
	{"DELETE FROM t WHERE id = 5 OR 10 > 2", true, false},
	{"DELETE FROM t WHERE id = 5 OR -2 > -10", true, false},
	{"DELETE FROM t WHERE id = 5 OR 0.5 > 0.25", true, false},
	{"DELETE FROM t WHERE id = 5 OR 1.0 = 1", true, false},
	{"DELETE FROM t WHERE id = 5 OR 'a' <> 'b'", true, false},
	{"DELETE FROM t WHERE id = 5 OR 1 IN (2, 1)", true, false},
	{"DELETE FROM t WHERE id = 5 OR NULL IS NULL", true, false},
	{"DELETE FROM t WHERE id = 5 OR (1 = 1) IS TRUE", true, false},
	{"DELETE FROM t WHERE id = 5 OR (1 = 2) IS NOT TRUE", true, false},
	{"DELETE FROM t WHERE id = 5 OR (NULL = 1) IS UNKNOWN", true, false},
	{"DELETE FROM t WHERE id = 5 OR 1 IN (NULL, 1)", true, false},
	{"DELETE FROM t WHERE (id = 5 AND 1.5 < 1) = false", true, false},
	{"DELETE FROM t WHERE (id = 5 AND 1 IN (2, 3)) = false", true, false},
	{"DELETE FROM t WHERE (id = 5 AND NULL IS NOT NULL) = false", true, false},
	{"DELETE FROM t WHERE (id = 5 AND (1 = 1) IS FALSE) = false", true, false},
	{"DELETE FROM t WHERE id * 1.0 = id", true, false},
	{"DELETE FROM t WHERE id + 0.00 = id", true, false},
	{"DELETE FROM t WHERE id = 1 OR id <> 1.0", true, false},
	// A string with a backslash has no known value: with standard_conforming_strings off, '\a'
	// is 'a'.
	{`DELETE FROM t WHERE '\a' = 'a'`, true, false},
	{`DELETE FROM t WHERE id = 5 OR '\a' <> 'a'`, true, false},
	{`DELETE FROM t WHERE '\a' <> E'\\a'`, true, false},
	{`DELETE FROM t WHERE id = 5 OR 'a\' IN ('a')`, true, false},
	{"MERGE INTO t USING s ON s.id = 1 WHEN MATCHED THEN DELETE", true, false},
	{"MERGE INTO t USING s ON t.id = t.id WHEN MATCHED THEN UPDATE SET a = 1", true, false},
	// Unparsable by pg_query (standard_conforming_strings off lets the server run these): the
	// WHERE cannot be checked.
	{`DELETE FROM t WHERE '\'' = ''''`, true, false},
	{`SELECT 1; DELETE FROM t WHERE '\'' = ''''`, true, false},
	{`update t set a = '\'' where ''''`, true, false},
	{`WITH x AS (SELECT '\'' ''''') MERGE INTO t USING x ON true WHEN MATCHED THEN DELETE`, true, false},
	{`TRUNCATE t '\''`, false, true},
	{"DELETE FROM", true, false},
	{"UPDATE", true, false},
	// Inside CTEs, EXPLAIN ANALYZE, PREPARE, COPY, and any statement.
	{"WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", true, false},
	{"WITH u AS (UPDATE t SET a = 1 WHERE true RETURNING id) SELECT count(*) FROM u", true, false},
	{"WITH a AS (SELECT 1), d AS (DELETE FROM t RETURNING 1) INSERT INTO log SELECT * FROM d", true, false},
	{"SELECT 1; DELETE FROM t", true, false},
	{"DELETE FROM t WHERE id = 1; UPDATE t SET a = 2", true, false},
	{"EXPLAIN ANALYZE DELETE FROM t", true, false},
	{"EXPLAIN (ANALYZE, BUFFERS) UPDATE t SET a = 1", true, false},
	{"PREPARE p AS DELETE FROM t", true, false},
	{"COPY (DELETE FROM t RETURNING *) TO STDOUT", true, false},
	{"MERGE INTO t USING s ON true WHEN MATCHED THEN DELETE", true, false},
	{"MERGE INTO t USING s ON 1 = 1 WHEN MATCHED THEN UPDATE SET a = s.a", true, false},
	// TRUNCATE.
	{"TRUNCATE t", false, true},
	{"TRUNCATE TABLE a, b RESTART IDENTITY CASCADE", false, true},
	{"SELECT 1; TRUNCATE t", false, true},
	{"TRUNCATE t; DELETE FROM u", true, true},
	// Safe.
	{"DELETE FROM t WHERE id = $1", false, false},
	{"UPDATE t SET a = 1 WHERE id = $1", false, false},
	{"DELETE FROM t WHERE a = 1 OR b = 2", false, false},
	{"UPDATE t SET a = u.a FROM u WHERE t.id = u.id", false, false},
	{"DELETE FROM t USING u WHERE t.id = u.id", false, false},
	{"DELETE FROM t WHERE CURRENT OF c", false, false},
	{"UPDATE t SET a = 1 WHERE CURRENT OF c", false, false},
	{"DELETE FROM t WHERE false", false, false},
	{"DELETE FROM t WHERE id IN (1, 2)", false, false},
	{"DELETE FROM t WHERE f(x)", false, false},
	{"DELETE FROM t WHERE NULL", false, false},
	{"DELETE FROM t WHERE 1 = 2", false, false},
	{"DELETE FROM t WHERE true AND id = 3", false, false},
	{"DELETE FROM t WHERE x <> x", false, false},
	{"DELETE FROM t WHERE active", false, false},
	{"DELETE FROM t WHERE NOT (x = x)", false, false},
	{"DELETE FROM t WHERE id = 5 OR 2 > 10", false, false},
	{"DELETE FROM t WHERE id = 5 OR -10 > -2", false, false},
	{"DELETE FROM t WHERE id = 5 OR 0.25 > 0.5", false, false},
	{"DELETE FROM t WHERE id = 5 OR 'a' = 'b'", false, false},
	{"DELETE FROM t WHERE id = 5 OR 1 NOT IN (2, 1)", false, false},
	{"DELETE FROM t WHERE NOT (1 = 1)", false, false},
	{"DELETE FROM t WHERE id = 5 OR (1 = 1) IS FALSE", false, false},
	{"DELETE FROM t WHERE id = 5 OR NULL IS NOT NULL", false, false},
	{"DELETE FROM t WHERE id = 5 OR (NULL = 1) IS NOT UNKNOWN", false, false},
	{"DELETE FROM t WHERE id = 5 OR 1 IN (NULL, 2)", false, false},
	{"DELETE FROM t WHERE 1 = 1 AND id = $1", false, false},
	// What applications send still passes.
	{"DELETE FROM t WHERE id = 5", false, false},
	{"UPDATE t SET a = 1 WHERE status = 'x' AND id > 3", false, false},
	{"DELETE FROM t WHERE id IN ($1, $2, $3)", false, false},
	{"DELETE FROM t WHERE id = ANY($1)", false, false},
	{"DELETE FROM t WHERE tenant_id = current_setting('app.tenant')::int", false, false},
	{"UPDATE t SET a = 1 WHERE deleted_at IS NULL", false, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.id = t.uid)", false, false},
	{"DELETE FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.id = t.uid)", false, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.id = t.uid AND u.id = 1)", false, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1 FROM unnest(t.tags) x WHERE x = 'a')", false, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1 FROM u HAVING count(*) > t.n)", false, false},
	{"DELETE FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.id = t.uid AND u.active)", false, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1 FROM u JOIN v ON v.uid = u.id WHERE u.id = t.uid AND v.x > 1)", false, false},
	{"DELETE FROM t WHERE (SELECT count(*) FROM u WHERE u.tid = t.id AND u.live) = 0", false, false},
	{"DELETE FROM t x WHERE EXISTS (SELECT 1 FROM u WHERE u.id = x.uid)", false, false},
	{"DELETE FROM t WHERE id = (SELECT max(id) FROM u)", false, false},
	{"DELETE FROM t WHERE id IN (SELECT tid FROM u WHERE u.expired)", false, false},
	{"DELETE FROM t WHERE (SELECT count(*) FROM u WHERE u.tid = t.id) = 0", false, false},
	{"DELETE FROM t WHERE ctid = ANY(ARRAY(SELECT ctid FROM t WHERE created < now() LIMIT 100))", false, false},
	{`UPDATE "users" SET "deleted_at"=$1 WHERE "users"."id" = $2 AND "users"."deleted_at" IS NULL`, false, false},
	{`UPDATE "t" SET "deleted_at"='2024-01-01' WHERE t.id = 5 AND t.deleted_at IS NULL`, false, false},
	{`UPDATE "users" AS "u" SET "name" = 'x' WHERE ("u"."id" = 1)`, false, false},
	{`DELETE FROM "goose_db_version" WHERE version_id=$1`, false, false},
	{"UPDATE public.t SET a = 1 WHERE public.t.id = $1", false, false},
	{"UPDATE t SET a = 1 WHERE lower(email) = lower($1)", false, false},
	{"UPDATE t SET a = 1 WHERE created_at < now() - interval '30 days'", false, false},
	{"UPDATE t SET a = 1 WHERE id = 5 OR id = 6", false, false},
	{"UPDATE t SET a = 1 WHERE (id = 5) = true", false, false},
	{"UPDATE t SET a = 1 WHERE id = 5 OR false", false, false},
	{"UPDATE t SET a = 1 WHERE 1 = 0", false, false},
	{"UPDATE t SET a = 1 WHERE id IN (NULL)", false, false},
	{"UPDATE t SET a = 1 WHERE NOT (id = 5)", false, false},
	{"UPDATE t SET a = 1 WHERE NOT (id = 5 OR true AND false)", false, false},
	{"UPDATE t SET a = 1 WHERE a < b", false, false},
	{"UPDATE t SET a = 1 WHERE id + 1 = 6", false, false},
	{"UPDATE t SET a = 1 WHERE (a, b) = (1, 2)", false, false},
	{"UPDATE t SET a = 1 WHERE tags @> ARRAY['x']", false, false},
	{"UPDATE t SET a = 1 WHERE name ILIKE $1", false, false},
	{"UPDATE t SET a = 1 WHERE id BETWEEN 1 AND 100", false, false},
	{"UPDATE t SET a = 1 WHERE CASE WHEN kind = 'a' THEN x > 1 ELSE false END", false, false},
	{"UPDATE t SET a = 1 WHERE is_stale(t.*)", false, false},
	{"UPDATE t SET a = 1 WHERE id = 5 AND id IS NOT NULL OR id = 6", false, false},
	{"DELETE FROM t WHERE id IS NULL", false, false},
	{"DELETE FROM t WHERE x IS NOT NULL", false, false},
	{"MERGE INTO t USING s ON s.id = 1 WHEN MATCHED AND t.expired THEN DELETE", false, false},
	{"MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET a = s.a", false, false},
	{"SELECT * FROM t WHERE 'update' = 'delete' AND x = 'truncate'", false, false},
	{"WITH d AS (DELETE FROM t WHERE id = 1 RETURNING *) SELECT * FROM d", false, false},
	{"EXPLAIN DELETE FROM t", false, false},
	{"EXPLAIN (ANALYZE false) DELETE FROM t", false, false},
	{"CREATE RULE r AS ON INSERT TO v DO INSTEAD DELETE FROM t", false, false},
	{"CREATE FUNCTION f() RETURNS void LANGUAGE sql BEGIN ATOMIC DELETE FROM t; END", false, false},
	{"MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE", false, false},
	{"MERGE INTO t USING s ON true WHEN NOT MATCHED THEN INSERT VALUES (1)", false, false},
	{"SELECT * FROM t FOR UPDATE", false, false},
	{"INSERT INTO t VALUES (1)", false, false},
	{"INSERT INTO t VALUES (1) ON CONFLICT (id) DO UPDATE SET a = 1", false, false},
	{"DELETE FROM t WHERE id = 1 -- ; DELETE FROM t", false, false},
	{"SELECT 'DELETE FROM t'", false, false},
	{"SELECT 'TRUNCATE t'", false, false},
	// Unparsable texts without a write keyword, or with UPDATE only in FOR UPDATE / DO UPDATE.
	{"SELECT FROM WHERE (", false, false},
	{`SELECT * FROM t WHERE a = '\'' FOR UPDATE`, false, false},
	{`SELECT * FROM t WHERE a = '\'' FOR NO KEY UPDATE`, false, false},
	{`INSERT INTO t VALUES ('\'') ON CONFLICT (id) DO UPDATE SET a = 1`, false, false},
	// The target's relation listed again ranges over the written row too: a condition that
	// the row meets with itself as its partner writes every row.
	{"DELETE FROM t USING t AS t2 WHERE t.email = t2.email", true, false},
	{"DELETE FROM t USING t AS t2 WHERE t.id = t2.id", true, false},
	{"DELETE FROM t a USING t b WHERE a.email = b.email", true, false},
	{"UPDATE t SET a = t2.a FROM t AS t2 WHERE t.id = t2.id", true, false},
	{"MERGE INTO t USING t AS s ON t.id = s.id WHEN MATCHED THEN DELETE", true, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1 FROM t AS t2 WHERE t2.id = t.id)", true, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1 FROM t AS t2 WHERE id = t.id)", true, false},
	{"DELETE FROM t WHERE id IN (SELECT id FROM t)", true, false},
	{"DELETE FROM t WHERE t.id = ANY (SELECT t2.id FROM t t2)", true, false},
	{"DELETE FROM t WHERE id IN (SELECT id FROM t WHERE true)", true, false},
	// ... but not one the row does not meet with itself, nor a partner that need not be it.
	{"DELETE FROM t USING t AS t2 WHERE t.email = t2.email AND t.id > t2.id", false, false},
	{"DELETE FROM t USING t AS t2 WHERE t.parent_id = t2.id", false, false},
	{"DELETE FROM t USING t AS t2 WHERE t.id = t2.id AND t2.archived", false, false},
	{"DELETE FROM t USING u JOIN t AS t2 ON t2.id = u.tid WHERE t.id = t2.id", false, false},
	{"DELETE FROM t USING t AS t2 TABLESAMPLE bernoulli (1) WHERE t.id = t2.id", false, false},
	{"DELETE FROM t USING archive.t AS a WHERE t.id = a.id", false, false},
	{"DELETE FROM public.t USING other.t AS a WHERE t.id = a.id", false, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1 FROM t AS c WHERE c.parent_id = t.id)", false, false},
	{"DELETE FROM t WHERE id IN (SELECT id FROM t WHERE created < now() - interval '1 day')", false, false},
	{"DELETE FROM t WHERE id IN (SELECT max(id) FROM t GROUP BY email)", false, false},
	{"DELETE FROM t WHERE id NOT IN (SELECT min(id) FROM t GROUP BY email)", false, false},
	{"DELETE FROM t WHERE id IN (SELECT id FROM t ORDER BY id LIMIT 100)", false, false},
	{"DELETE FROM t WHERE id IN (SELECT id FROM t, u WHERE u.x = 1)", false, false},
	{"MERGE INTO t USING t AS s ON t.id = s.id WHEN MATCHED AND s.stale THEN DELETE", false, false},
	// Comparisons of an expression with itself seen through a scalar subquery, a double minus,
	// an array of one.
	{"DELETE FROM t WHERE id = (SELECT id)", true, false},
	{"DELETE FROM t WHERE t.id = (SELECT t.id)", true, false},
	{"DELETE FROM t WHERE -(-id) = id", true, false},
	{"DELETE FROM t WHERE id = ANY (ARRAY[id])", true, false},
	{"DELETE FROM t WHERE id = ANY (ARRAY[5, id])", true, false},
	{"DELETE FROM t WHERE id = (SELECT max(id) FROM t)", false, false},
	{"DELETE FROM t WHERE id = (SELECT id + 1)", false, false},
	{"DELETE FROM t WHERE -id = id", false, false},
	{"DELETE FROM t WHERE id = ANY (ARRAY[1, 2])", false, false},
	{"DELETE FROM t WHERE id <> ALL (ARRAY[id])", false, false},
	// Uncorrelated with the target, as before: every row or none.
	{"DELETE FROM t WHERE EXISTS (SELECT 1 FROM t AS t2 WHERE id = 5)", true, false},
	{"", false, false},
}

// facts are the guard facts of sql, parsed or not, as the pattern package computes them.
func facts(sql string) Facts {
	tree, err := pg.Parse(sql)
	if err != nil {
		return Unparsed(sql)
	}
	return Check(tree)
}

func TestGuards(t *testing.T) {
	if len(guardCases) < 40 {
		t.Fatalf("guard table has %d cases, want at least 40", len(guardCases))
	}
	for _, tc := range guardCases {
		t.Run(tc.sql, func(t *testing.T) {
			f := facts(tc.sql)
			if f.UnsafeWrite != tc.unsafe || f.Truncate != tc.truncate {
				t.Errorf("%q: UnsafeWrite=%v Truncate=%v, want %v %v",
					tc.sql, f.UnsafeWrite, f.Truncate, tc.unsafe, tc.truncate)
			}
		})
	}
}

// TestNeverTrueNeedsExactSameness: a comparison of an expression with itself is proved never
// true (and the write admitted as writing no row) only for a column, a parameter or a literal.
// A call may be volatile and a cast may lose what tells two values apart, so each of these is
// true for every row and the write is refused, as a DELETE and as an UPDATE.
func TestNeverTrueNeedsExactSameness(t *testing.T) {
	for _, tc := range []struct {
		where  string
		unsafe bool
	}{
		{"gen_random_uuid() <> gen_random_uuid()", true}, // two calls, two values
		{"random() <> random()", true},
		{"random() < random()", true},
		{"random() IS DISTINCT FROM random()", true},
		{"NOT (random() = random())", true},
		{"NOT (random() >= random())", true},
		{"id = 5 OR random() <> random()", true},
		{"0.5 <> 0.5::int", true},      // 0.5 <> 1
		{"now() <> now()::date", true}, // true but at midnight
		{"id <> id::int2", true},
		{"name COLLATE \"C\" <> name", true},
		// Never true, but not proved so: refusing a write of no row costs nothing.
		{"lower(name) <> lower(name)", true},
		{"id::int <> id::int", true},
		// Columns, parameters and literals are the same in every row.
		{"id <> id", false},
		{"id < id", false},
		{"t.id > id", false},
		{"id IS DISTINCT FROM id", false},
		{"NOT (id = id)", false},
		{"NOT (id <= t.id)", false},
		{"$1 <> $1", false},
		{"1 < 1.0", false},
		{"id = 5 OR id <> id", false},
	} {
		for _, sql := range []string{"DELETE FROM t WHERE " + tc.where, "UPDATE t SET a = 1 WHERE " + tc.where} {
			t.Run(sql, func(t *testing.T) {
				if f := facts(sql); f.UnsafeWrite != tc.unsafe {
					t.Errorf("%q: UnsafeWrite %v, want %v", sql, f.UnsafeWrite, tc.unsafe)
				}
			})
		}
	}
}

// FuzzRequireWhere checks the require_where rule's algebra on the WHERE w of any DELETE the
// fuzzer finds that parses: w OR true never restricts, nor does NOT w OR w unless it is never
// true (w NULL); w AND id = 5 and w AND false always do; NOT NOT w is judged as w is; and the
// rule is deterministic. The formulas are built on the parse tree, so no text of w can change
// how they group.
func FuzzRequireWhere(f *testing.F) {
	for _, tc := range guardCases {
		if _, w, ok := strings.Cut(tc.sql, " WHERE "); ok {
			f.Add(w)
		}
	}
	f.Fuzz(func(t *testing.T, cond string) {
		tree, err := pg.Parse("DELETE FROM t WHERE " + cond)
		if err != nil || len(tree.Stmts) != 1 {
			return
		}
		d, ok := tree.Stmts[0].Stmt.Node.(*pg.Node_DeleteStmt)
		if !ok || d.DeleteStmt.WhereClause == nil {
			return
		}
		rel, w := d.DeleteStmt.Relation, d.DeleteStmt.WhereClause
		or := func(a ...*pg.Node) *pg.Node { return pg.MakeBoolExprNode(pg.BoolExprType_OR_EXPR, a, 0) }
		and := func(a ...*pg.Node) *pg.Node { return pg.MakeBoolExprNode(pg.BoolExprType_AND_EXPR, a, 0) }
		not := func(a *pg.Node) *pg.Node { return pg.MakeBoolExprNode(pg.BoolExprType_NOT_EXPR, []*pg.Node{a}, 0) }
		boolean := func(b bool) *pg.Node {
			return &pg.Node{Node: &pg.Node_AConst{AConst: &pg.A_Const{Val: &pg.A_Const_Boolval{Boolval: &pg.Boolean{Boolval: b}}}}}
		}
		idIs5 := pg.MakeAExprNode(pg.A_Expr_Kind_AEXPR_OP, []*pg.Node{pg.MakeStrNode("=")},
			pg.MakeColumnRefNode([]*pg.Node{pg.MakeStrNode("id")}, 0), pg.MakeAConstIntNode(5, 0), 0)

		verdict := restricts(rel, nil, w)
		if restricts(rel, nil, w) != verdict {
			t.Fatalf("%q: two verdicts", cond)
		}
		if restricts(rel, nil, or(w, boolean(true))) {
			t.Errorf("(%s) OR true restricts", cond)
		}
		// NOT w OR w holds wherever w is not null: it restricts only if it is never true at all
		// (w NULL).
		if e := or(not(w), w); restricts(rel, nil, e) {
			if r := (restrictor{never: map[polar]bool{}, canons: map[*pg.Node]string{}}); !r.neverTrue(e, false) {
				t.Errorf("NOT (%s) OR (%s) restricts", cond, cond)
			}
		}
		if !restricts(rel, nil, and(w, idIs5)) {
			t.Errorf("(%s) AND id = 5 does not restrict", cond)
		}
		if !restricts(rel, nil, and(w, boolean(false))) {
			t.Errorf("(%s) AND false does not restrict", cond)
		}
		if got := restricts(rel, nil, not(not(w))); got != verdict {
			t.Errorf("NOT NOT (%s) restricts: %v, (%s): %v", cond, got, cond, verdict)
		}
	})
}

// TestGuardDeepNesting: conditions nested hundreds deep are judged (each level of a condition
// used as a value is judged both ways, which without memory would double the work per level),
// and correctly.
func TestGuardDeepNesting(t *testing.T) {
	const depth = 300
	for _, tc := range []struct {
		where  string
		unsafe bool
	}{
		{strings.Repeat("(id = 5 AND ", depth) + "true" + strings.Repeat(") = true", depth), false},
		{strings.Repeat("(id = id AND ", depth) + "true" + strings.Repeat(") = true", depth), true},
		{strings.Repeat("NOT (id = 5 OR ", depth) + "true" + strings.Repeat(")", depth), false},
		{strings.Repeat("coalesce(", depth) + "id IS NULL OR id IS NOT NULL" + strings.Repeat(", true)", depth), true},
	} {
		tree, err := pg.Parse("DELETE FROM t WHERE " + tc.where)
		if err != nil {
			t.Fatalf("%.60s...: %v", tc.where, err)
		}
		if f := Check(tree); f.UnsafeWrite != tc.unsafe {
			t.Errorf("%.60s...: UnsafeWrite %v, want %v", tc.where, f.UnsafeWrite, tc.unsafe)
		}
	}
}

// BenchmarkGuardCheck is the require_where rule on a parsed write (each distinct statement text
// pays it once, when its pattern is built).
func BenchmarkGuardCheck(b *testing.B) {
	const q = `UPDATE "users" SET "deleted_at"=$1 WHERE "users"."id" = $2 AND "users"."deleted_at" IS NULL ` +
		`AND EXISTS (SELECT 1 FROM orgs o WHERE o.id = "users"."org_id" AND o.active)`
	tree, err := pg.Parse(q)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if Check(tree).UnsafeWrite {
			b.Fatal("unsafe")
		}
	}
}

// FuzzGuard checks that no text panics the guard, parsed or not, that it is deterministic, and
// that a statement whose WHERE is the literal true is refused: every UPDATE and DELETE among
// the text's statements is given WHERE true on the parse tree (so no text can change how it
// reads), and the text must then hold an unsafe write.
func FuzzGuard(f *testing.F) {
	for _, tc := range guardCases {
		f.Add(tc.sql)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		tree, err := pg.Parse(sql)
		if err != nil {
			Unparsed(sql)
			return
		}
		got := Check(tree)
		if Check(tree) != got {
			t.Fatalf("%q: two verdicts", sql)
		}
		always := &pg.Node{Node: &pg.Node_AConst{AConst: &pg.A_Const{Val: &pg.A_Const_Boolval{Boolval: &pg.Boolean{Boolval: true}}}}}
		writes := false
		for _, s := range tree.Stmts {
			switch x := s.Stmt.GetNode().(type) {
			case *pg.Node_UpdateStmt:
				writes, x.UpdateStmt.WhereClause = true, always
			case *pg.Node_DeleteStmt:
				writes, x.DeleteStmt.WhereClause = true, always
			}
		}
		if writes && !Check(tree).UnsafeWrite {
			t.Errorf("%q with WHERE true: not refused", sql)
		}
	})
}
