package pattern

import (
	"testing"

	pg "github.com/pganalyze/pg_query_go/v5"
)

// TestKeyCarriageReturnEndsLineComment: PostgreSQL's lexer (and pg_query's, the same one)
// ends a "--" comment at a newline, which is \n or \r (scan.l: newline [\n\r]). Key must strip
// no more than the server ignores: a DELETE after "-- c\r" is run by the server, so the guard
// must see it.
func TestKeyCarriageReturnEndsLineComment(t *testing.T) {
	for _, sql := range []string{
		"-- note\rDELETE FROM t",                    // leading comment, old-Mac line ending
		"DELETE FROM t WHERE id = 1 -- c\r OR true", // trailing comment hides OR true
		"/* tag='x' */ -- c\rUPDATE t SET a = 1",
	} {
		t.Run(sql, func(t *testing.T) {
			tree, err := pg.Parse(sql)
			if err != nil || len(tree.Stmts) != 1 {
				t.Fatalf("pg_query on the whole text: %v, %d statements", err, len(tree.GetStmts()))
			}
			p := Analyze(sql)
			if !p.UnsafeWrite {
				t.Errorf("Analyze(%q): UnsafeWrite=false (Key=%q), want true: the server runs an unrestricted write",
					sql, Key(sql))
			}
		})
	}
}

// TestKeyCRLFStillStrips: a CRLF-terminated comment is stripped as before, and a comment
// ending in \r before nothing is stripped (nothing follows it).
func TestKeyCRLFStillStrips(t *testing.T) {
	for sql, want := range map[string]string{
		"-- c\r\nSELECT 1":                "SELECT 1",
		"SELECT 1 -- c\r\n":               "SELECT 1",
		"DELETE FROM t WHERE id = 1 -- c": "DELETE FROM t WHERE id = 1",
	} {
		if got := Key(sql); got != want {
			t.Errorf("Key(%q) = %q, want %q", sql, got, want)
		}
	}
}

// TestGuardFactsAdversarial: adversarial texts and the guard facts they must have.
func TestGuardFactsAdversarial(t *testing.T) {
	for _, tc := range []struct {
		sql              string
		unsafe, truncate bool
	}{
		{"SELECT 1;\rDELETE FROM t", true, false},
		{"EXPLAIN ANALYSE DELETE FROM t", true, false},
		{"EXPLAIN (ANALYSE) DELETE FROM t", true, false},
		{"EXPLAIN (ANALYZE false, analyze) DELETE FROM t", true, false},
		{"EXPLAIN (ANALYZE 'true') UPDATE t SET a = 1", true, false},
		{"CREATE TABLE x AS WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", true, false},
		{"INSERT INTO log WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", true, false},
		{"COPY (UPDATE t SET a = 1 RETURNING *) TO STDOUT", true, false},
		{"DECLARE c CURSOR FOR SELECT 1; DELETE FROM t", true, false},
		{"CREATE VIEW v AS SELECT 1; DELETE FROM t", true, false},
		{"CREATE RULE r AS ON INSERT TO v DO INSTEAD DELETE FROM t WHERE id = 1; DELETE FROM t", true, false},
		{"DELETE /* x */ FROM t", true, false},
		{"SELECT 1 /* DELETE FROM t */", false, false},
		{"DELETE FROM t WHERE id = 1 /* unterminated", true, false},
		{"MERGE INTO t USING s ON t.id = s.id OR true WHEN MATCHED THEN DELETE", true, false},
		{"MERGE INTO t x USING s ON t.id = s.id WHEN MATCHED THEN DELETE", true, false},
		{"MERGE INTO t USING s ON true WHEN MATCHED AND s.x = 1 THEN DELETE", true, false},
		{"MERGE INTO t USING s ON true WHEN MATCHED AND t.x = 1 THEN DELETE WHEN MATCHED THEN UPDATE SET a = 1", true, false},
		{"MERGE INTO t x USING s ON x.id = s.id WHEN MATCHED THEN DELETE", false, false},
		{"DELETE FROM t WHERE EXISTS (SELECT 1 WHERE t.id IS NULL OR t.id IS NOT NULL)", true, false},
		{"DELETE FROM t WHERE (t.*) = (t.*)", true, false},
		{"DELETE FROM t WHERE id OPERATOR(pg_catalog.=) id", true, false},
		{"DELETE FROM t WHERE id IS NOT DISTINCT FROM 5 OR id IS DISTINCT FROM 5", true, false},
		{"DELETE FROM t WHERE $1::bool", true, false},
		{"UPDATE t SET a = 1 FROM u WHERE t.id = t.id", true, false},
		{"DELETE FROM ONLY t", true, false},
		{"TRUNCATE ONLY t", false, true},
		{"UPDATE t SET a = 1 WHERE t.* IS NOT NULL", false, false},
		{"DELETE FROM t WHERE id = 5 AND id <> 5", false, false},
	} {
		t.Run(tc.sql, func(t *testing.T) {
			p := Analyze(tc.sql)
			if p.UnsafeWrite != tc.unsafe || p.Truncate != tc.truncate {
				t.Errorf("Analyze(%q): UnsafeWrite=%v Truncate=%v, want %v %v",
					tc.sql, p.UnsafeWrite, p.Truncate, tc.unsafe, tc.truncate)
			}
		})
	}
}
