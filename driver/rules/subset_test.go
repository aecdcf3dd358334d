package rules

import (
	"math/rand/v2"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// subsetCases are files in the subset, each an edge of it; FuzzYAMLSubset starts from them.
var subsetCases = []string{
	"a: 1\n",
	"a: 1",
	"a: 1\r\nb: 2\r\n",
	"---\na: 1\n",
	"--- # the rules\n\n# a comment\na: 1\n",
	"# only a comment first\n\n  a: 1\n  b:\n    c: d\n",
	"a:\n  b:\n    c: 1\n  d: 2\ne: 3\n",
	"a:\n- 1\n- 2\nb: 3\n",
	"a:\n  - 1\n  -\n  - - x\n    - y\n  - k: v\n    l: w\n",
	"- a: 1\n  b:\n  - x\n  c: 2\n- 3\n",
	"- \n- # empty\n-\n  a: 1\n",
	"a:\nb: ~\nc: null\nd: Null\n",
	"a: {}\nb: []\nc: {x: 1, y: [1, 2, {z: w}]}\n",
	"a: {x: 1,\n  y: 2}   # trailing\nb: [1,\n\n  # inside\n  2\n  ]\n",
	"{a: 1, b: [x, y]}\n",
	"[1, 2]\n",
	"{\"a\":1, 'b' :2, c :3}\n",
	"a: 'it''s'\nb: \"\\x41\\u00e9\\U0001F600\\t\\n\\\\\\\"\\N\\_\\L\"\n",
	"'quoted key': 1\n\"other\" : 2\n",
	"a: b c  d   # comment\n",
	"a: b#c\nd: e:f\ng: http://x/y\n",
	"a: -1\nb: -.inf\nc: .NaN\nd: 0x1F\ne: 0o17\nf: 1_000\ng: 1e3\nh: +1\ni: 010\n",
	"a: true\nb: True\nc: yes\nd: off\ne: 2001-12-14\nf: 2001-12-14t21:59:43.10-05:00\n",
	"a: 'true'\nb: \"1\"\nc: ''\n",
	"a: é 😀\n",
	"{a: [b, c], d: {e: f}}",
	"a: [x, -y, 1:2, a?b]\n",
	"match: {port: 5432, addr: 10.0.0.0/8, glob: rep*}\n",
	"server_cores: 4\nbudgets:\n  - name: a\n    max_concurrent: 0\n",
	"budgets:\n  - {name: a, max_concurent: 4}\n  - name: a\n    mode: x\n    per: ''\nrules:\n  - budget: b\n    match: {app: 10.0.0.0/33}\n  - budget: a\n    match:\n      app: x\n      app: y\n",
	"health_interval: 0\nguards:\n  require_where: enforce\n  block_truncate: {mode: warn, match: {app: web}}\ncoordination: {redis: 'redis://x'}\n",
	"rules:\n  - budget: x\n    match: {app: }\n",
	"a:\n  b: 1\n c: 2\n",
	"a: 1\n  b: 2\n",
	"a: b\n  c\n",
	"- a\n  b\n",
	"a: {b: c\n  d}\n",
	"a: {b: 1,}\n",
	"a: &x 1\nb: *x\n",
	"a: !!str 1\n",
	"a: |\n  text\n",
	"? a\n: b\n",
	"<<: {a: 1}\n",
	"a:\tb\n",
	"a: 1\n---\nb: 2\n",
	"a: 1\n...\n",
	"%YAML 1.2\n---\na: 1\n",
	"a: 'x\n  y'\n",
	"a: 1 # c\n  # deeper comment\nb: 2\n",
	"a: {b: 1, # c\n# at the margin\n  c: 2}\n",
	"- - - x\n",
	"a:\n  - x\n  b: 1\n",
	"{a: 1} x\n",
	"a: [b]: c\n",
	"a: b: c\n",
	"a:b\n",
	"'a':b\n",
	"a: \"\\ud800\"\n",
	"\n\n",
	"",
	"x",
}

// FuzzYAMLSubset: whenever subsetTree reads a file, the YAML parser reads it too, into the
// same tree, and Parse makes the same of both, errors included.
func FuzzYAMLSubset(f *testing.F) {
	for _, name := range []string{"testdata/full.yaml", "testdata/full.json"} {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add(largeRulesFile(3))
	for _, s := range subsetCases {
		f.Add([]byte(s))
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		g := yamlGenerator{rng: rng}
		g.block(0, 0)
		f.Add([]byte(g.b.String()))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fast, ok := subsetTree(data)
		if !ok {
			return
		}
		slow, err := yamlTree(data)
		if err != nil {
			t.Fatalf("subsetTree read a file the YAML parser refuses (%v)", err)
		}
		if diff := sameTree(fast, slow, "$"); diff != "" {
			t.Fatalf("trees differ at %s", diff)
		}
		c1, err1 := decode(fast)
		c2, err2 := decode(slow)
		if !reflect.DeepEqual(c1, c2) || errText(err1) != errText(err2) {
			t.Fatalf("subset read: %v %v\nYAML read: %v %v", c1, err1, c2, err2)
		}
	})
}

// The files rules files are made of are read by subsetTree, as the YAML parser reads them,
// and their problems are reported on the same lines.
func TestYAMLSubsetReads(t *testing.T) {
	full, err := os.ReadFile("testdata/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		file []byte
		want string // part of the error, or "" for none
	}{
		{"full.yaml", full, ""},
		{"generated", largeRulesFile(50), ""},
		{"indentless lists", []byte("budgets:\n- name: a\n  max_concurrent: 2\nrules:\n- budget: a\n  match:\n    app: x\n"), ""},
		{"flow over lines", []byte("budgets: [{name: a}]\nrules:\n  - budget: a\n    match: {app: x,\n            tenant: 't1'}\n"), ""},
		{"document start", []byte("---\n# rules\nserver_cores: 2\n"), ""},
		{"windows line breaks", []byte("server_cores: 2\r\nbudgets:\r\n  - {name: a}\r\n"), ""},
		{"quoted scalars", []byte("health_queries:\n  \"my-load\": 'select ''x'''\n  other: \"select \\\"y\\\"\"\n"), ""},
		{"typed scalars", []byte("a: [1, -2.5, 0x1f, .inf, true, yes, null, ~, 2001-12-14, '1', \"true\"]\n"), "line 1: a: unknown field"},
		{"words", []byte("a: [true, True, TRUE, tRUE, false, FALSE, falsey, null, NULL, nil, no, on, off, y, tenant, n1]\n"), "line 1: a: unknown field"},
		{"unknown field", []byte("budgets:\n  - name: a\n\n    max_concurent: 4\n"), "line 4: budgets[0].max_concurent: unknown field"},
		{"duplicate key", []byte("server_cores: 2\n# again\nserver_cores: 3\n"), "line 3: server_cores: duplicate key (first on line 1)"},
		{"explicit zero", []byte("budgets:\n- {name: a,\n   max_concurrent: 0}\n"), "line 3: budgets[0].max_concurrent: must be > 0"},
		{"null in a match", []byte("budgets: [{name: a}]\nrules:\n  - budget: a\n    match:\n      app:\n"), "line 5: rules[0].match.app: expected a string, got null"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fast, ok := subsetTree(tt.file)
			if !ok {
				t.Fatal("declined")
			}
			slow, err := yamlTree(tt.file)
			if err != nil {
				t.Fatal(err)
			}
			if diff := sameTree(fast, slow, "$"); diff != "" {
				t.Fatalf("trees differ at %s", diff)
			}
			c1, err1 := decode(fast)
			c2, err2 := decode(slow)
			if !reflect.DeepEqual(c1, c2) || errText(err1) != errText(err2) {
				t.Fatalf("subset read: %v\nYAML parser read: %v", err1, err2)
			}
			if got := errText(err1); tt.want == "" && got != "" || !strings.Contains(got, tt.want) {
				t.Errorf("error %q, want one containing %q", got, tt.want)
			}
		})
	}
}

// What the subset leaves out goes to the YAML parser, which reads it or names the problem.
func TestYAMLSubsetDeclines(t *testing.T) {
	tests := []struct{ name, file string }{
		{"empty", ""},
		{"only comments", "# nothing\n\n"},
		{"a scalar document", "x\n"},
		{"anchor and alias", "a: &x 1\nb: *x\n"},
		{"tag", "a: !!str 1\n"},
		{"literal block scalar", "a: |\n  text\n"},
		{"folded block scalar", "a: >\n  text\n"},
		{"plain scalar over two lines", "a: b\n  c\n"},
		{"plain entry over two lines", "- a\n  b\n"},
		{"plain scalar over two lines in flow", "a: {b: c\n  d}\n"},
		{"quoted scalar over two lines", "a: 'x\n  y'\n"},
		{"directive", "%YAML 1.2\n---\na: 1\n"},
		{"explicit key", "? a\n: b\n"},
		{"merge key", "<<: {a: 1}\nb: 2\n"},
		{"tab", "a:\tb\n"},
		{"lone carriage return", "a: 1\rb: 2\n"},
		{"byte order mark", "\ufeffa: 1\n"},
		{"NUL", "a: \x00\n"},
		{"invalid UTF-8", "a: \xff\n"},
		{"line separator", "a: x\u2028y\n"},
		{"second document", "a: 1\n---\nb: 2\n"},
		{"document end", "a: 1\n...\n"},
		{"content after document start", "--- a: 1\n"},
		{"trailing comma", "a: {b: 1,}\n"},
		{"empty flow value", "a: {b: }\n"},
		{"flow key without value", "a: {b}\n"},
		{"pair in a flow sequence", "a: [b: c]\n"},
		{"flow line at the key's indentation", "a: {b: 1,\nc: 2}\n"},
		{"key at odd indentation", "a:\n  b: 1\n c: 2\n"},
		{"value indented past its key", "a: 1\n  b: 2\n"},
		{"key below an indented list", "a:\n  - x\n  b: 1\n"},
		{"text after a flow collection", "{a: 1} x\n"},
		{"flow collection as key", "[a]: b\n"},
		{"two values on a line", "a: b: c\n"},
		{"colon without space", "a:b\n"},
		{"comment without space", "a: 'b'#c\n"},
		{"unknown escape", "a: \"\\q\"\n"},
		{"surrogate escape", "a: \"\\ud800\"\n"},
		{"unterminated quote", "a: 'b\n"},
		{"long key", longKey() + ": 1\n"},
		{"deep nesting", deepFlow(maxDepth + 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if root, ok := subsetTree([]byte(tt.file)); ok {
				t.Fatalf("read as %s", describeNode(root))
			}
		})
	}
}

func longKey() string {
	b := make([]byte, maxKeyLength+1)
	for i := range b {
		b[i] = 'k'
	}
	return string(b)
}

func deepFlow(depth int) string {
	var s []byte
	for range depth {
		s = append(s, '[')
	}
	for range depth {
		s = append(s, ']')
	}
	return string(s)
}

// A file read by subsetTree and by the YAML parser makes the same Config.
func TestLargeYAMLSubsetMatchesYAMLParser(t *testing.T) {
	data := largeRulesFile(500)
	fast, ok := subsetTree(data)
	if !ok {
		t.Fatal("declined")
	}
	slow, err := yamlTree(data)
	if err != nil {
		t.Fatal(err)
	}
	c1, err1 := decode(fast)
	c2, err2 := decode(slow)
	if err1 != nil || err2 != nil || !reflect.DeepEqual(c1, c2) {
		t.Fatalf("subset read %v, YAML parser %v", err1, err2)
	}
}

// TestYAMLSubsetGenerated compares subsetTree with the YAML parser on files generated from
// the subset's grammar, with odd indentation and spacing mixed in: the byte-level mutations of
// FuzzYAMLSubset seldom build deep structures. Set YAML_SUBSET_FILES to generate more.
func TestYAMLSubsetGenerated(t *testing.T) {
	n := 3000
	if s := os.Getenv("YAML_SUBSET_FILES"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	accepted := 0
	for range n {
		g := yamlGenerator{rng: rng}
		g.block(0, 0)
		data := []byte(g.b.String())
		fast, ok := subsetTree(data)
		if !ok {
			continue
		}
		accepted++
		slow, err := yamlTree(data)
		if err != nil {
			t.Fatalf("subsetTree read a file the YAML parser refuses (%v):\n%s", err, data)
		}
		if diff := sameTree(fast, slow, "$"); diff != "" {
			t.Fatalf("trees differ at %s:\n%s", diff, data)
		}
	}
	t.Logf("%d of %d generated files read", accepted, n)
	if accepted < n/4 {
		t.Errorf("only %d of %d generated files read: the generator or the reader drifted", accepted, n)
	}
}

// yamlGenerator writes random YAML in and around the subset.
type yamlGenerator struct {
	rng *rand.Rand
	b   strings.Builder
}

var generatedScalars = []string{
	"a", "tenant-1", "x y", "1", "-1", "0.5", "1e3", ".inf", "-.inf", "0x1f", "0o17", "010", "1_000",
	"true", "True", "false", "null", "~", "yes", "no", "2001-12-14", "a#b", "a:b", "http://x/y",
	"'q'", "'it''s'", "''", `"d"`, `"\t\u00e9"`, `""`, "-x", "--", "---x", "é", "a b  c", "+1", "0",
	"10.0.0.0/8", "a ", "- a", "a: b", "[a]",
}

// outsideScalars are outside the subset, or errors: a generated file holds one now and then.
var outsideScalars = []string{"*", "&a", "!t", "|", ">", "?x", "@", "%", "<<", "'a", "\"\\q\""}

func (g *yamlGenerator) pick(s ...string) string { return s[g.rng.IntN(len(s))] }

func (g *yamlGenerator) scalar() string {
	if g.rng.IntN(30) == 0 {
		return g.pick(outsideScalars...)
	}
	return g.pick(generatedScalars...)
}

// indent returns the indentation of a nested block: usually deeper, sometimes odd.
func (g *yamlGenerator) indent(parent int) int {
	switch g.rng.IntN(20) {
	case 0:
		return parent
	case 1:
		return max(parent-1, 0)
	}
	return parent + 1 + g.rng.IntN(3)
}

// space separates an indicator from a value: usually one space, sometimes two or none.
func (g *yamlGenerator) space() string {
	switch g.rng.IntN(10) {
	case 0:
		return ""
	case 1:
		return "  "
	}
	return " "
}

func (g *yamlGenerator) pad(n int) { g.b.WriteString(strings.Repeat(" ", n)) }

// eol ends a line, now and then with spaces, a comment or a blank line.
func (g *yamlGenerator) eol() {
	switch g.rng.IntN(10) {
	case 0:
		g.b.WriteString("  # c")
	case 1:
		g.b.WriteString(" ")
	case 2:
		g.b.WriteString("\n\n# c")
	case 3:
		g.b.WriteString("\r")
	}
	g.b.WriteString("\n")
}

// block writes a block mapping or sequence at indent, whose first line starts at the cursor.
func (g *yamlGenerator) block(indent, depth int) {
	seq := g.rng.IntN(3) == 0
	for i := range 1 + g.rng.IntN(4) {
		if i > 0 {
			g.pad(indent)
		}
		if seq {
			g.b.WriteString("-")
		} else {
			g.b.WriteString(g.scalar())
			g.b.WriteString(g.pick(":", ":", " :"))
		}
		g.value(indent, depth, seq)
	}
}

// value writes the rest of an entry or pair: an inline value, or a nested block.
func (g *yamlGenerator) value(indent, depth int, inSeq bool) {
	switch r := g.rng.IntN(10); {
	case depth < 4 && r < 3:
		g.eol()
		in := g.indent(indent)
		g.pad(in)
		g.block(in, depth+1)
	case depth < 4 && r == 3 && inSeq:
		sp := g.space()
		g.b.WriteString(sp)
		g.block(indent+1+len(sp), depth+1) // a compact mapping or sequence
	case depth < 4 && r == 4:
		g.b.WriteString(g.space())
		g.flow(indent, depth+1)
		g.eol()
	case r == 5:
		g.eol() // empty
	default:
		g.b.WriteString(g.space())
		g.b.WriteString(g.scalar())
		g.eol()
	}
}

// flow writes a flow collection, sometimes over several lines.
func (g *yamlGenerator) flow(indent, depth int) {
	mapping := g.rng.IntN(2) == 0
	open, closing := "[", "]"
	if mapping {
		open, closing = "{", "}"
	}
	g.b.WriteString(open)
	for i := range g.rng.IntN(4) {
		if i > 0 {
			g.b.WriteString(g.pick(", ", ",", " ,", ",\n"+strings.Repeat(" ", g.indent(indent))))
		}
		if mapping {
			g.b.WriteString(g.scalar())
			g.b.WriteString(g.pick(": ", ":", " : "))
		}
		if depth < 4 && g.rng.IntN(4) == 0 {
			g.flow(indent, depth+1)
		} else {
			g.b.WriteString(g.scalar())
		}
	}
	g.b.WriteString(g.pick(closing, " "+closing, "\n"+strings.Repeat(" ", g.indent(indent))+closing))
}
