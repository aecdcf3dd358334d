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
