package pattern

import "testing"

// guardCases check that Analyze stores the guard facts of its text (the guard package's own
// table tests the rule itself): parsed or not, with comments and in any statement.
var guardCases = []struct {
	sql              string
	unsafe, truncate bool
}{
	{"DELETE FROM t", true, false},
	{"/* app='web' */ UPDATE t SET a = 1 WHERE true -- x", true, false},
	{"SELECT 1; DELETE FROM t WHERE id = id", true, false},
	{"WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", true, false},
	{"TRUNCATE t", false, true},
	{"TRUNCATE t; DELETE FROM u", true, true},
	{`DELETE FROM t WHERE '\'' = ''''`, true, false},
	{`TRUNCATE t '\''`, false, true},
	{"DELETE FROM t WHERE id = $1", false, false},
	{"UPDATE t SET a = 1 WHERE deleted_at IS NULL", false, false},
	{"DELETE FROM t WHERE false", false, false},
	{"EXPLAIN DELETE FROM t", false, false},
	{"SELECT 'DELETE FROM t'", false, false},
	{"SELECT FROM WHERE (", false, false},
	{"", false, false},
}

func TestGuardFacts(t *testing.T) {
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

// backslashCases are texts that a server with standard_conforming_strings off reads otherwise
// than pg_query, which reads them with it on: a backslash before a quote ends a string
// elsewhere. Such a text is also judged as that server reads it (a write pg_query takes for a
// string or a comment is refused; one that server cannot parse runs nothing there), or by its
// words where that reading cannot be written for pg_query (a B'...' string), and Key strips
// nothing after the string. A backslash before no quote changes no statement, nor does one in
// an E” string, which escapes either way.
var backslashCases = []struct {
	sql              string
	unsafe, truncate bool
}{
	{`SELECT '\'' ; DELETE FROM t; --'`, true, false}, // pg_query: one string
	{`SELECT '\' -- '; DELETE FROM t`, true, false},   // pg_query: a string, then a comment
	{`SELECT '\'' ; TRUNCATE t; --'`, false, true},
	{`SELECT '\'' ; UPDATE t SET a = 1; --'`, true, false},
	{`/* c */ SELECT 'a\' -- '; DELETE FROM t -- d`, true, false},
	{`DELETE FROM t WHERE id = 1 AND x = '\' AND id = 1 OR x = ''' OR true --'`, true, false},
	{`UPDATE t SET p = 'C:\' WHERE id = 1`, false, false},  // with the setting off, a string that never ends
	{`UPDATE t SET p = '\' WHERE id = 1 --'`, true, false}, // with it off, no WHERE
	{`UPDATE t SET b = B'1', p = '\' WHERE id = 1 --'`, true, false},
	// Safe either way: with the setting off, each is a syntax error (a string ends early).
	{`UPDATE files SET path = replace(path, '\', '/') WHERE id = $1`, false, false},
	{`INSERT INTO notes (path, body) VALUES ('C:\', 'please delete me')`, false, false},
	{`SELECT count(*) FROM notes WHERE path = 'C:\' AND body <> 'delete'`, false, false},
	{`SELECT '\'' FOR UPDATE --'`, false, false},
	{`SELECT 'C:\' -- x`, false, false},
	{`UPDATE t SET p = 'C:\dir' WHERE id = 1`, false, false},
	{`DELETE FROM t WHERE code ~ '^\d+$' AND id = $1`, false, false},
	{`UPDATE t SET a = E'it\'s' WHERE id = 1 -- c`, false, false},
	{`UPDATE t SET a = e'\\' WHERE id = 1`, false, false},
	{`UPDATE t SET a = '\\' WHERE id = 1`, false, false},
	{`UPDATE t SET a = $$\'$$ WHERE id = 1`, false, false},
	{`UPDATE t SET "a\'" = 1 WHERE id = 1`, false, false},
	{`DELETE FROM t WHERE id = 1 -- \'`, false, false},
}

func TestBackslashQuoteHidesNoWrite(t *testing.T) {
	for _, tc := range backslashCases {
		t.Run(tc.sql, func(t *testing.T) {
			p := Analyze(tc.sql)
			if p.UnsafeWrite != tc.unsafe || p.Truncate != tc.truncate {
				t.Errorf("Analyze(%q): UnsafeWrite=%v Truncate=%v, want %v %v",
					tc.sql, p.UnsafeWrite, p.Truncate, tc.unsafe, tc.truncate)
			}
		})
	}
}
