package pattern

import (
	"strings"
	"testing"
)

func TestKey(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"SELECT 1", "SELECT 1"},
		{"  SELECT 1 ;\n", "SELECT 1"},
		{"SELECT 1;;  ;", "SELECT 1"},
		{"/* traceparent='00-abc-01' */ SELECT 1", "SELECT 1"},
		{"-- leading\nSELECT 1", "SELECT 1"},
		{"SELECT 1 /*controller='users',traceparent='00-x-y-01'*/", "SELECT 1"},
		{"SELECT 1 /*a*/ /*b*/ -- c", "SELECT 1"},
		{"SELECT 1; -- done", "SELECT 1"},
		{"SELECT 1 /* a /* nested */ b */", "SELECT 1"},
		{"/* a */ -- b\n /* c */ SELECT 1 /* d */ ;", "SELECT 1"},
		{"SELECT '--x'", "SELECT '--x'"},
		{"SELECT '/* not */'", "SELECT '/* not */'"},
		{"SELECT 'a' -- c", "SELECT 'a'"},
		{"SELECT '--' -- c", "SELECT '--'"},
		{"SELECT \"a--b\" -- c", "SELECT \"a--b\""},
		{"SELECT $$ -- $$ -- c", "SELECT $$ -- $$"},
		{"SELECT $tag$ */ $tag$ /* c */", "SELECT $tag$ */ $tag$"},
		{"SELECT E'\\' -- ' -- c", "SELECT E'\\' -- '"},
		{"SELECT 'it''s' /* c */", "SELECT 'it''s'"},
		{`SELECT 'a\b' -- c`, `SELECT 'a\b'`},
		{`SELECT '\\' -- c`, `SELECT '\\'`},
		// With standard_conforming_strings off, a string and a DELETE: nothing is stripped.
		{`SELECT '\' -- '; DELETE FROM t`, `SELECT '\' -- '; DELETE FROM t`},
		{`SELECT '\'' ; DELETE FROM t; --'`, `SELECT '\'' ; DELETE FROM t; --'`},
		{`SELECT '\'' -- c`, `SELECT '\'' -- c`},
		{"SELECT a$b$c FROM t -- c", "SELECT a$b$c FROM t"},
		{"SELECT $1 -- c", "SELECT $1"},
		{"SELECT 1; SELECT 2; -- c", "SELECT 1; SELECT 2"},
		{"SELECT 1 -- c\n FROM t", "SELECT 1 -- c\n FROM t"},
		{"SELECT 1 /* unterminated", "SELECT 1 /* unterminated"},
		{"/* unterminated SELECT 1", "/* unterminated SELECT 1"},
		{"SELECT 'unterminated -- x", "SELECT 'unterminated -- x"},
		{"-- only a comment", ""},
		{"/* only */ ; ", ""},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			if got := Key(tc.in); got != tc.want {
				t.Errorf("Key(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestKeyIsSubstring(t *testing.T) {
	in := "/* x */ SELECT 1 /* y */"
	k := Key(in)
	if !strings.Contains(in, k) {
		t.Fatalf("Key(%q) = %q, not a substring", in, k)
	}
	if n := testing.AllocsPerRun(100, func() { Key(in) }); n != 0 {
		t.Errorf("Key allocates %v times per call, want 0", n)
	}
}

func FuzzKey(f *testing.F) {
	for _, tc := range append(guardCases, backslashCases...) {
		f.Add(tc.sql)
		f.Add("/* c */ " + tc.sql + " -- d")
	}
	f.Add("/* /*/ */ x")
	f.Add("/* a */* b */")
	f.Fuzz(func(t *testing.T, sql string) {
		if strings.HasPrefix(sql, "/*") {
			n, ok := blockComment(sql)
			if rn, rok := refBlockComment(sql); n != rn || ok != rok {
				t.Fatalf("blockComment(%q) = %d, %v; reference %d, %v", sql, n, ok, rn, rok)
			}
		}
		k := Key(sql)
		if !strings.Contains(sql, k) {
			t.Fatalf("Key(%q) = %q is not a substring", sql, k)
		}
		if Key(k) != k {
			t.Fatalf("Key not idempotent: Key(%q) = %q, Key of that = %q", sql, k, Key(k))
		}
		// Comments and whitespace around the text never change the key.
		if Key("/* tag='x' */ "+sql+"\n/*traceparent='00-1-2-01'*/") != k && !strings.Contains(sql, "/*") &&
			!strings.ContainsAny(sql, "'\"$-") {
			t.Fatalf("surrounding comments changed the key of %q", sql)
		}
	})
}

// refBlockComment is the byte-by-byte statement of PostgreSQL's nested
// comment rule that blockComment implements with vectorised searches.
func refBlockComment(sql string) (int, bool) {
	depth := 0
	for i := 0; i+1 < len(sql); {
		switch {
		case sql[i] == '/' && sql[i+1] == '*':
			depth++
			i += 2
		case sql[i] == '*' && sql[i+1] == '/':
			depth--
			i += 2
			if depth == 0 {
				return i, true
			}
		default:
			i++
		}
	}
	return len(sql), false
}
