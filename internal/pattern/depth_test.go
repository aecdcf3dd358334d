package pattern

import (
	"strings"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v5"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/guard"
)

// nestingCases are texts and how deep nesting counts them: the operators chained in an
// operand, the set operations and joins of a level, one per level of parentheses, brackets or
// CASE; list and boolean separators start another operand.
var nestingCases = []struct {
	name string
	sql  string
	want int
}{
	{"no operator", "SELECT a FROM t", 0},
	{"chain", "SELECT a + b * c - d", 3},
	{"parenthesis", "SELECT (a + b) * c", 3},
	{"prefix and postfix", "SELECT NOT a IS NULL", 2},
	{"cast", "SELECT $1::int::text", 2},
	{"list", "SELECT a + 1, b + 1, c + 1", 1},
	{"values", "INSERT INTO t VALUES (1 + 1, 2), (-3, 4), ($1::int, 5)", 2},
	{"or of comparisons", "SELECT 1 FROM t WHERE a = 1 OR a = 2 OR a = 3 AND b = 4", 1},
	{"between", "SELECT 1 FROM t WHERE a BETWEEN b AND c + d", 2},
	{"case", "SELECT CASE WHEN a = 1 THEN b + 1 WHEN a = 2 THEN 0 ELSE -1 END + 1", 3},
	{"case in a chain", "SELECT 1 + CASE WHEN a THEN 1 END + CASE WHEN b THEN 2 END", 3},
	{"set operations", "SELECT a, b FROM t UNION ALL SELECT a, b FROM u EXCEPT SELECT 1, 2", 2},
	{"joins across ON", "SELECT 1 FROM a JOIN b ON x AND y JOIN c ON z", 2},
	{"subquery", "SELECT (SELECT (SELECT 1))", 2},
	{"statements", "SELECT 1 UNION SELECT 2; SELECT a + b + c; END", 2},
	{"unclosed", "SELECT ((1 + 2", 3},
}

func TestNesting(t *testing.T) {
	for _, tc := range nestingCases {
		t.Run(tc.name, func(t *testing.T) {
			scan, err := pg.Scan(tc.sql)
			if err != nil {
				t.Fatal(err)
			}
			if got := nesting(scan.Tokens); got != tc.want {
				t.Errorf("nesting(%q) = %d, want %d", tc.sql, got, tc.want)
			}
		})
	}
}

// TestDeepTextIsUnparsable: a text nested deeper than maxNesting is unparsable, as a text
// pg_query rejects is, without being given to pg_query: its C code recurses on the thread's
// stack once or more per level, and 50,000 UNION ALL (or a chain of 50,000 ||) overflows it
// and kills the process, which no recover catches.
func TestDeepTextIsUnparsable(t *testing.T) {
	over := maxNesting + 1
	r := strings.Repeat
	for _, tc := range []struct{ name, sql string }{
		{"50,000 UNION ALL", "SELECT 1" + r(" UNION ALL SELECT 1", 50_000)},
		{"50,000 ||", "SELECT 'a'" + r(" || 'a'", 50_000)},
		{"UNION ALL", "SELECT 1" + r(" UNION ALL SELECT 1", over)},
		{"+", "SELECT 1" + r(" + 1", over)},
		{"casts", "SELECT 1" + r("::int", over)},
		{"NOT", "SELECT 1 WHERE " + r("NOT ", over) + "true"},
		{"subqueries", r("SELECT (", over) + "SELECT 1" + r(")", over)},
		{"50,000 parentheses", "SELECT " + r("(", 50_000) + "1" + r(")", 50_000)},
		{"joins with AND in ON", "SELECT 1 FROM a" + r(" JOIN a ON true AND true", over)},
		{"BETWEEN", "SELECT 1" + r(" BETWEEN 1 AND 1 IS NULL", over)},
		{"CASE in a chain", "SELECT 1" + r(" + CASE WHEN true THEN 1 ELSE 2 END", over)},
		{"a write", "UPDATE t SET a = 'x'" + r(" || 'x'", over) + " WHERE id = 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Analyze(tc.sql)
			if p.Parsed || p.Kind != vocab.KindOther || p.Normalized != "" || p.Statements != 0 ||
				len(p.Tables) != 0 || !hex16RE.MatchString(p.Fingerprint) || p.Facts != guard.Unparsed(tc.sql) {
				t.Errorf("a text nested %d deep: parsed %v, kind %q, normalised %.40q, tables %q, fingerprint %q, facts %+v",
					over, p.Parsed, p.Kind, p.Normalized, p.Tables, p.Fingerprint, p.Facts)
			}
		})
	}
}

// TestModeratelyDeepTextParses: the bound leaves alone what applications send: a UNION ALL of
// maxNesting SELECTs, and lists however long, whose items are siblings in the tree (a bulk
// INSERT, an IN list, an OR of comparisons, a CASE of many branches).
func TestModeratelyDeepTextParses(t *testing.T) {
	n := 5_000
	if raceEnabled {
		n = 1_000
	}
	r := strings.Repeat
	for _, tc := range []struct{ name, sql, kind string }{
		{"UNION ALL", "SELECT 1" + r(" UNION ALL SELECT 1", maxNesting), vocab.KindSelect},
		{"||", "SELECT 'a'" + r(" || 'a'", maxNesting/2), vocab.KindSelect},
		{"bulk INSERT", bulkInsert(n), vocab.KindInsert},
		{"IN list", "SELECT * FROM t WHERE id IN (" + r("1, ", n) + "1)", vocab.KindSelect},
		{"OR of comparisons", "DELETE FROM t WHERE" + r(" (a = 1 AND b = -1) OR", n) + " false", vocab.KindDelete},
		{"CASE", "SELECT CASE" + r(" WHEN a = 1 THEN a + 1", n) + " END FROM t", vocab.KindSelect},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if p := Analyze(tc.sql); !p.Parsed || p.Kind != tc.kind {
				t.Errorf("parsed %v, kind %q, want parsed, kind %q", p.Parsed, p.Kind, tc.kind)
			}
		})
	}
}

// FuzzNesting checks that nesting bounds how deep pg_query's tree nests, so that no
// construct it leaves uncounted can be repeated to overflow pg_query's stack: the tree of a
// text within the bound is at most treeLevels deep per level counted (an operator takes two, a
// Node and its message; a subquery's parenthesis six, for the sublink, the SELECT and its
// target), and treeBase more.
func FuzzNesting(f *testing.F) {
	const treeLevels, treeBase = 7, 40
	for _, tc := range nestingCases {
		f.Add(tc.sql)
	}
	for _, tc := range append(guardCases, backslashCases...) {
		f.Add(tc.sql)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		scan, err := pg.Scan(sql)
		if err != nil {
			return
		}
		n := nesting(scan.Tokens)
		if n > maxNesting {
			return
		}
		tree, err := pg.Parse(sql)
		if err != nil {
			return
		}
		if d := treeDepth(tree.ProtoReflect()); d > treeLevels*n+treeBase {
			t.Fatalf("the tree of %q is %d deep, nesting counts %d", sql, d, n)
		}
	})
}

// treeDepth is how deep m's messages nest, m included.
func treeDepth(m protoreflect.Message) int {
	d := 0
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Message() == nil || fd.IsMap():
		case fd.IsList():
			for i, l := 0, v.List(); i < l.Len(); i++ {
				d = max(d, treeDepth(l.Get(i).Message()))
			}
		default:
			d = max(d, treeDepth(v.Message()))
		}
		return true
	})
	return d + 1
}
