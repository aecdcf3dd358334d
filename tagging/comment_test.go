package tagging

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/internal/bounded"
)

func TestAppend(t *testing.T) {
	tests := []struct {
		name string
		sql  string
		tags Tags
		want string
	}{
		{"no tags", "SELECT 1;", Tags{}, "SELECT 1;"},
		{"plain", "SELECT 1", New("a", "b"), "SELECT 1 /*a='b'*/"},
		{"before semicolon", "SELECT 1;", New("a", "b"), "SELECT 1 /*a='b'*/;"},
		{"before trailing space and semicolons", "SELECT 1 ;\n", New("a", "b"), "SELECT 1 /*a='b'*/ ;\n"},
		{"after the last of several statements", "SELECT 1; SELECT 2;", New("a", "b"), "SELECT 1; SELECT 2 /*a='b'*/;"},
		{"sorted, comma-joined", "SELECT 1", New("tenant", "42", "app", "billing", "route", "x"),
			"SELECT 1 /*app='billing',route='x',tenant='42'*/"},
		// The examples of the spec's key and value serialization sections.
		{"spec examples", "SELECT * FROM FOO",
			New("route parameter", "/param first", "a", "DROP TABLE FOO", "n", "1234"),
			"SELECT * FROM FOO /*a='DROP%20TABLE%20FOO',n='1234',route%20parameter='%2Fparam%20first'*/"},
		{"quote, star, slash, dash cannot escape the comment", "SELECT 1", New("k", "it's */ /* --"),
			"SELECT 1 /*k='it%27s%20%2A%2F%20%2F%2A%20--'*/"},
		{"separators and plus encoded", "SELECT 1", New("a=b,c", "x+y=z,'"),
			"SELECT 1 /*a%3Db%2Cc='x%2By%3Dz%2C%27'*/"},
		{"unreserved bytes kept", "SELECT 1", New("a-b_c.d~", "AZaz09-_.~"), "SELECT 1 /*a-b_c.d~='AZaz09-_.~'*/"},
		{"non-UTF-8 and control bytes", "SELECT 1", New("k", "\xff\x00\n"), "SELECT 1 /*k='%FF%00%0A'*/"},
		{"UTF-8", "SELECT 1", New("k", "é"), "SELECT 1 /*k='%C3%A9'*/"},
		{"empty value", "SELECT 1", New("k", ""), "SELECT 1 /*k=''*/"},
		{"empty statement", "", New("a", "b"), "/*a='b'*/"},
		{"only a semicolon", ";", New("a", "b"), "/*a='b'*/;"},
		{"existing block comment left alone", "SELECT 1 /* hi */", New("a", "b"), "SELECT 1 /* hi */"},
		{"existing leading comment left alone", "/*x='y'*/ SELECT 1", New("a", "b"), "/*x='y'*/ SELECT 1"},
		{"existing line comment left alone", "SELECT 1 -- hi", New("a", "b"), "SELECT 1 -- hi"},
		{"comment-like literal also left alone", "SELECT '--'", New("a", "b"), "SELECT '--'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Append(tt.sql, tt.tags); got != tt.want {
				t.Errorf("Append(%q) =\n%q, want\n%q", tt.sql, got, tt.want)
			}
		})
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		sql  string
		want []pair
	}{
		{"no comment", "SELECT 1;", nil},
		{"empty", "", nil},
		{"trailing", "SELECT 1 /*a='b'*/", []pair{{"a", "b"}}},
		{"trailing before semicolon and space", "SELECT 1 /*a='b'*/ ; \n", []pair{{"a", "b"}}},
		{"spec exhibit", "SELECT * FROM FOO /*action='%2Fparam*d',controller='index',framework='spring'," +
			"traceparent='00-5bd66ef5095369c7b0d1f8f4bd33716a-c532cb4098ac3dd2-01'," +
			"tracestate='congo%3Dt61rcWkgMzE%2Crojo%3D00f067aa0ba902b7'*/",
			[]pair{{"action", "/param*d"}, {"controller", "index"}, {"framework", "spring"},
				{"traceparent", "00-5bd66ef5095369c7b0d1f8f4bd33716a-c532cb4098ac3dd2-01"},
				{"tracestate", "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"}}},
		{"spec key and value examples", "SELECT 1 /*route%20parameter='%2Fparam%20first'*/",
			[]pair{{"route parameter", "/param first"}}},
		{"backslash-escaped quote", `SELECT 1 /*a='it\'s',b='x'*/`, []pair{{"a", "it's"}, {"b", "x"}}},
		{"backslash before a percent-escape", `SELECT 1 /*a='\%41'*/`, []pair{{"a", "A"}}},
		{"plus is a space", "SELECT 1 /*a='x+y',b='x%2By'*/", []pair{{"a", "x y"}, {"b", "x+y"}}},
		{"lower-case hex", "SELECT 1 /*a='%c3%a9'*/", []pair{{"a", "é"}}},
		{"non-UTF-8 bytes", "SELECT 1 /*a='%FF%00'*/", []pair{{"a", "\xff\x00"}}},
		{"spaces around pairs", "SELECT 1 /* a = 'b' , c='d' */", []pair{{"a", "b"}, {"c", "d"}}},
		{"unsorted input sorted", "SELECT 1 /*b='2',a='1'*/", []pair{{"a", "1"}, {"b", "2"}}},
		{"repeated key, last wins", "SELECT 1 /*a='1',b='2',a='3'*/", []pair{{"a", "3"}, {"b", "2"}}},
		{"raw comma in quoted value", "SELECT 1 /*a='x,y',b='z'*/", []pair{{"a", "x,y"}, {"b", "z"}}},
		{"empty value", "SELECT 1 /*a=''*/", []pair{{"a", ""}}},
		{"leading comment", "  /*app='x'*/ SELECT 1;", []pair{{"app", "x"}}},
		{"trailing wins over leading", "/*a='lead'*/ SELECT 1 /*b='trail'*/", []pair{{"b", "trail"}}},
		{"middle comment ignored", "SELECT /*a='b'*/ 1", nil},
		{"not sqlcommenter", "SELECT 1 /* just a note */", nil},
		{"empty comment", "SELECT 1 /**/", nil},
		{"line comment", "SELECT 1 -- a='b'", nil},
		{"shared star is not a comment", "SELECT 1 /*/", nil},
		{"final close closes nothing", "SELECT /*x*/a='b'*/", nil},
		{"leading comment with nested open", "/* /*a='b'*/ */ SELECT 1", nil},
		{"unclosed leading comment", "/*a='b' SELECT 1", nil},
		// Malformed pairs are skipped, the rest kept.
		{"no equals", "SELECT 1 /*junk,a='1'*/", []pair{{"a", "1"}}},
		{"unquoted value", "SELECT 1 /*a=1,b='2'*/", []pair{{"b", "2"}}},
		{"junk after value", "SELECT 1 /*a='1'x,b='2'*/", []pair{{"b", "2"}}},
		{"unterminated value", "SELECT 1 /*b='2',a='1*/", []pair{{"b", "2"}}},
		{"escaped closing quote", `SELECT 1 /*a='1\'*/`, nil},
		{"bad percent-escape", "SELECT 1 /*a='%zz',b='2'*/", []pair{{"b", "2"}}},
		{"truncated percent-escape", "SELECT 1 /*b='2',a='%2'*/", []pair{{"b", "2"}}},
		{"bad key escape", "SELECT 1 /*%g='1',b='2'*/", []pair{{"b", "2"}}},
		{"empty key", "SELECT 1 /*='1',b='2'*/", []pair{{"b", "2"}}},
		{"trailing comma", "SELECT 1 /*a='1',*/", []pair{{"a", "1"}}},
		{"equals with nothing after", "SELECT 1 /*a=*/", nil},
		// Bounds: over-long pairs are skipped, and pairs past the 32nd are not read.
		{"value at the bound kept", "SELECT 1 /*a='" + strings.Repeat("v", bounded.ValueLen) + "'*/",
			[]pair{{"a", strings.Repeat("v", bounded.ValueLen)}}},
		{"long value skipped", "SELECT 1 /*a='" + strings.Repeat("v", 10<<10) + "',b='2'*/", []pair{{"b", "2"}}},
		{"long decoded value skipped", "SELECT 1 /*a='" + strings.Repeat("%C3%A9", bounded.ValueLen/2+1) + "',b='2'*/",
			[]pair{{"b", "2"}}},
		{"long key skipped", "SELECT 1 /*" + strings.Repeat("k", bounded.KeyLen+1) + "='1',b='2'*/", []pair{{"b", "2"}}},
		{"first 32 pairs read", "SELECT 1 /*" + manyPairs(40) + "*/", pairsUpTo(maxCommentPairs)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assertTags(t, Parse(tt.sql), tt.want)
		})
	}
}

// manyPairs returns n pairs k00='0',k01='1',... for a comment body.
func manyPairs(n int) string {
	ps := make([]string, n)
	for i := range ps {
		ps[i] = fmt.Sprintf("k%02d='%d'", i, i)
	}
	return strings.Join(ps, ",")
}

// pairsUpTo returns the first n pairs of manyPairs.
func pairsUpTo(n int) []pair {
	var ps []pair
	for i := range n {
		ps = append(ps, pair{fmt.Sprintf("k%02d", i), fmt.Sprint(i)})
	}
	return ps
}

// appendable reports whether Append may write into sql.
func appendable(sql string) bool {
	return !strings.Contains(sql, "/*") && !strings.Contains(sql, "--")
}

func FuzzRoundTrip(f *testing.F) {
	f.Add("SELECT 1;", "app", "billing", "route", "/orders/{id}", "x", "")
	f.Add("SELECT * FROM t WHERE a = 'x' ;\n", "it's", "*/", "/*", "--", ",='\\", "%zz+")
	f.Add("", "\xff\xfe", "\x00", "k", "v'*/;", "a b", "é")
	f.Add(" ; ", "a", "1", "a", "2", "", "dropped")
	f.Add("SELECT 2*/1", "a/", "*", "b*", "/", "k", "\\'")
	f.Add("SELECT 1 -- note", "a", "b", "c", "d", "e", "f")
	f.Fuzz(func(t *testing.T, sql, k1, v1, k2, v2, k3, v3 string) {
		tags := New(k1, v1, k2, v2, k3, v3)
		out := Append(sql, tags)
		if !appendable(sql) {
			if out != sql {
				t.Fatalf("Append mutated a statement with a comment: %q -> %q", sql, out)
			}
			sql = strings.NewReplacer("/*", "", "--", "").Replace(sql)
			if !appendable(sql) {
				sql = "SELECT 1"
			}
			out = Append(sql, tags)
		}
		var want []pair // Parse reads back every pair within its bounds, the ones Append writes
		for _, p := range pairsOf(tags) {
			if len(p.k) <= bounded.KeyLen && len(p.v) <= bounded.ValueLen {
				want = append(want, p)
			}
		}
		if len(want) == 0 {
			if out != sql {
				t.Fatalf("Append with no tag within bounds changed %q to %q", sql, out)
			}
			return
		}
		stmt := trimTrailing(sql)
		if !strings.HasPrefix(out, stmt) || !strings.HasSuffix(out, sql[len(stmt):]) {
			t.Fatalf("Append(%q) = %q does not keep the statement and its tail", sql, out)
		}
		comment := strings.TrimPrefix(strings.TrimSuffix(out, sql[len(stmt):])[len(stmt):], " ")
		inner := strings.TrimSuffix(strings.TrimPrefix(comment, "/*"), "*/")
		if len(inner) != len(comment)-4 || strings.Contains(inner, "*/") || strings.Contains(inner, "/*") {
			t.Fatalf("comment %q is not one well-formed block comment", comment)
		}
		for i := 0; i < len(inner); i++ {
			if inner[i] >= 0x80 || inner[i] < 0x20 {
				t.Fatalf("comment %q holds a non-printable or non-ASCII byte", comment)
			}
		}
		if got := Parse(out); !slices.Equal(pairsOf(got), want) {
			t.Fatalf("Parse(Append(%q, %q)) = %q", sql, pairsOf(tags), pairsOf(got))
		}
	})
}

func FuzzParse(f *testing.F) {
	f.Add("SELECT 1")
	f.Add("SELECT 1 /*a='b',c='d'*/;")
	f.Add("/*app='x'*/ SELECT 1")
	f.Add(`SELECT 1 /* a = 'it\'s' , b='%zz', c='x+y%2B', ='e', f=g, h='\*/`)
	f.Add("/*/")
	f.Add("/**/")
	f.Add("SELECT /*x*/a='b'*/")
	f.Add("/*a='%")
	f.Add("/*a='\\")
	f.Fuzz(func(t *testing.T, sql string) {
		got := Parse(sql)
		prev := ""
		for i, p := range pairsOf(got) {
			if p.k == "" || (i > 0 && p.k <= prev) {
				t.Fatalf("Parse(%q) = %q: keys not unique, sorted and non-empty", sql, pairsOf(got))
			}
			if len(p.k) > bounded.KeyLen || len(p.v) > bounded.ValueLen {
				t.Fatalf("Parse(%q) = %q: a pair past the bounds", sql, pairsOf(got))
			}
			prev = p.k
		}
		if got.Len() > maxCommentPairs {
			t.Fatalf("Parse(%q) read %d pairs", sql, got.Len())
		}
		// Whatever was read must survive being written back.
		if again := Parse(Append("SELECT 1", got)); !slices.Equal(pairsOf(again), pairsOf(got)) {
			t.Fatalf("re-encoding Parse(%q) = %q gave %q", sql, pairsOf(got), pairsOf(again))
		}
	})
}

const (
	benchPlain     = "SELECT id, total FROM orders WHERE customer_id = $1 AND status = $2 ORDER BY created_at DESC LIMIT 50;"
	benchCommented = "SELECT id, total FROM orders WHERE customer_id = $1 AND status = $2 ORDER BY created_at DESC LIMIT 50 " +
		"/*app='billing',controller='orders',route='%2Forders%2F%7Bid%7D',tenant='42'*/;"
)

func BenchmarkParse(b *testing.B) {
	for _, bc := range []struct{ name, sql string }{
		{"no comment", benchPlain},
		{"comment", benchCommented},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					_ = Parse(bc.sql)
				}
			})
		})
	}
}

func BenchmarkAppend(b *testing.B) {
	tags := New("app", "billing", "controller", "orders", "route", "/orders/{id}", "tenant", "42")
	b.ReportAllocs()
	for b.Loop() {
		_ = Append(benchPlain, tags)
	}
}
