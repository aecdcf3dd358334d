package pattern

import "testing"

// guardCases are the guard verdicts of issue 5: UPDATE/DELETE with no WHERE
// or a constant-true WHERE are unsafe, everywhere in the text.
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
	{"DELETE FROM t WHERE x = x + 0", false, false},
	{"DELETE FROM t WHERE CURRENT OF c", false, false},
	{"UPDATE t SET a = 1 WHERE CURRENT OF c", false, false},
	{"DELETE FROM t WHERE false", false, false},
	{"DELETE FROM t WHERE id IN (1, 2)", false, false},
	{"DELETE FROM t WHERE f(x)", false, false},
	{"DELETE FROM t WHERE NULL", false, false},
	{"DELETE FROM t WHERE 1 = 2", false, false},
	{"DELETE FROM t WHERE true AND id = 3", false, false},
	{"DELETE FROM t WHERE 'a' < 'b'", false, false},
	{"DELETE FROM t WHERE x <> x", false, false},
	{"DELETE FROM t WHERE t.x = x", false, false},
	{"DELETE FROM t WHERE active", false, false},
	{"DELETE FROM t WHERE NOT (x = x)", false, false},
	{"DELETE FROM t WHERE EXISTS (SELECT 1)", false, false},
	{"DELETE FROM t WHERE 1 = 1 AND id = $1", false, false},
	{"DELETE FROM t WHERE 1e999999999 > 0", false, false},
	{"DELETE FROM t WHERE 'maybe'::boolean", false, false},
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
	{"DELETE FROM", false, false},
	{"", false, false},
}

func TestGuards(t *testing.T) {
	if len(guardCases) < 40 {
		t.Fatalf("guard table has %d cases, want at least 40", len(guardCases))
	}
	for _, tc := range guardCases {
		t.Run(tc.sql, func(t *testing.T) {
			p := Analyze(tc.sql)
			if p.UnsafeWrite != tc.unsafe || p.Truncate != tc.truncate {
				t.Errorf("Analyze(%q): UnsafeWrite=%v Truncate=%v, want %v %v",
					tc.sql, p.UnsafeWrite, p.Truncate, tc.unsafe, tc.truncate)
			}
		})
	}
}
