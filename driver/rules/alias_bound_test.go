package rules

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// aliasAmplifiedFile is a small YAML rules file of n rules whose match is an alias of the first
// rule's match, a mapping of n pairs: n lines of file text that expand into n×n match pairs.
func aliasAmplifiedFile(n int) []byte {
	var sb strings.Builder
	sb.WriteString("budgets: [{name: a}]\nrules:\n- {budget: a, match: &m {")
	for i := range n {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "k%d: v", i)
	}
	sb.WriteString("}}\n")
	for range n - 1 {
		sb.WriteString("- {budget: a, match: *m}\n")
	}
	return []byte(sb.String())
}

// TestAliasExpansionIsBounded: the package documentation promises that parsing and validation
// take time in proportion to the file, and the rules file is re-read on every change by a
// long-running process. The decoder follows YAML aliases itself (the YAML library bounds them
// only in its typed decoding): expanded in full, a 69 KB file of 2,000 rules sharing one
// 2,000-pair match would decode 4 million pairs, allocating about 830 MB, and a file of a
// megabyte or two would exhaust memory on a reload. An ordinary file allocates about 34 bytes
// per byte of file; this test allows 200.
func TestAliasExpansionIsBounded(t *testing.T) {
	data := aliasAmplifiedFile(2000)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := Parse(data)
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("file %d bytes; Parse allocated %d MB; err: %v", len(data), alloc>>20, err)
	if err == nil {
		t.Errorf("the file parsed: want aliases refused")
	}
	if limit := 200 * uint64(len(data)); alloc > limit {
		t.Fatalf("Parse of a %d-byte file allocated %d MB (> %d MB, 200× the file): aliases expand without bound",
			len(data), alloc>>20, limit>>20)
	}
}

// TestAliasBound: aliases that repeat a value a few times are followed; aliases that stand for
// more than the bound (many times a large value, aliases of aliases doubling at each level, or
// a value that holds an alias of itself) are refused on the line of the alias that crosses it,
// without the anchor's name.
func TestAliasBound(t *testing.T) {
	var laughs strings.Builder // each level is a list of ten aliases of the one before
	laughs.WriteString("health_queries: {}\nx0: &secret0 [a, b, c, d, e, f, g, h, i, j]\n")
	for i := 1; i <= 9; i++ {
		fmt.Fprintf(&laughs, "x%d: &secret%d [", i, i)
		for j := range 10 {
			if j > 0 {
				laughs.WriteString(", ")
			}
			fmt.Fprintf(&laughs, "*secret%d", i-1)
		}
		laughs.WriteString("]\n")
	}
	for _, tc := range []struct {
		name    string
		file    string
		refused bool
		line    int // of the error, when it is known
	}{
		{"a match shared by a few rules", "budgets: [{name: a}]\nrules:\n" +
			"- {budget: a, match: &m {app: shop, controller: export}}\n" +
			"- {budget: a, match: *m, until: 2026-12-02T10:00:00Z}\n" +
			"- {budget: a, match: *m, until: 2027-12-02T10:00:00Z}\n", false, 0},
		{"many aliases of a large match", string(aliasAmplifiedFile(2000)), true, 39},
		{"aliases of aliases", laughs.String(), true, 0},
		{"a list holding an alias of itself", "budgets: &secret [*secret]\n", true, 1},
		{"a mapping holding an alias of itself", "health_queries: &secret\n  a: *secret\n", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.file))
			var e *Error
			switch {
			case !tc.refused:
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			case !errors.As(err, &e) || !strings.Contains(e.Msg, "aliases expand the file too much"):
				t.Fatalf("got %v; want aliases refused", err)
			case tc.line != 0 && e.Line != tc.line:
				t.Errorf("line %d, want %d: %v", e.Line, tc.line, err)
			}
			if strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "&m") {
				t.Errorf("the message names the anchor: %v", err)
			}
		})
	}
}

// TestAliasBoundCountsOnce: the count of what an alias stands for is made once per anchor, with
// the aliases in it expanded, so the bound holds for aliases of aliases without expanding them.
func TestAliasBoundCountsOnce(t *testing.T) {
	var n yaml.Node
	if err := yaml.Unmarshal([]byte("a: &a [1, 2]\nb: &b [*a, *a]\nc: [*b, *b, *a]\n"), &n); err != nil {
		t.Fatal(err)
	}
	x := expansion{bound: 1000, sizes: map[*yaml.Node]int{}}
	if at := x.cross(n.Content[0]); at != nil {
		t.Fatalf("crossed the bound at line %d", at.Line)
	}
	// b is its list and two of a (3 each): 7; c's aliases stand for 7 + 7 + 3, b's for 6.
	if want := 6 + 17; x.used != want {
		t.Errorf("aliases stand for %d nodes, want %d", x.used, want)
	}
	if len(x.sizes) != 2 {
		t.Errorf("%d anchors counted, want 2", len(x.sizes))
	}
}
