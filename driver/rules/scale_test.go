package rules

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// largeRulesFile writes a rules file of n budgets, each with a share and a rule of two pairs.
func largeRulesFile(n int) []byte {
	var sb strings.Builder
	sb.WriteString("server_cores: 64\nbudgets:\n")
	for i := range n {
		fmt.Fprintf(&sb, "  - {name: tenant-%d, mode: enforce, max_concurrent: 4, server_share: 0.001}\n", i)
	}
	sb.WriteString("rules:\n")
	for i := range n {
		fmt.Fprintf(&sb, "  - {budget: tenant-%d, match: {app: shop, tenant: t%d}}\n", i, i)
	}
	return []byte(sb.String())
}

// largeRulesJSON is largeRulesFile written as JSON.
func largeRulesJSON(n int) []byte {
	var sb strings.Builder
	sb.WriteString("{\"server_cores\": 64,\n\"budgets\": [\n")
	for i := range n {
		if i > 0 {
			sb.WriteString(",\n")
		}
		fmt.Fprintf(&sb, `  {"name": "tenant-%d", "mode": "enforce", "max_concurrent": 4, "server_share": 0.001}`, i)
	}
	sb.WriteString("],\n\"rules\": [\n")
	for i := range n {
		if i > 0 {
			sb.WriteString(",\n")
		}
		fmt.Fprintf(&sb, `  {"budget": "tenant-%d", "match": {"app": "shop", "tenant": "t%d"}}`, i, i)
	}
	sb.WriteString("]}\n")
	return []byte(sb.String())
}

// The JSON and YAML forms of a large file read as the same config.
func TestLargeJSONMatchesYAML(t *testing.T) {
	fromJSON, err := Parse(largeRulesJSON(1000))
	if err != nil {
		t.Fatal(err)
	}
	fromYAML, err := Parse(largeRulesFile(1000))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fromJSON, fromYAML) {
		t.Fatal("the JSON and YAML forms of one file read differently")
	}
}

// BenchmarkParseLarge parses and validates a file of 100k budgets and 100k rules, as JSON and
// as YAML: every lookup of a rule's budget must be a map probe, not a scan of the budgets.
func BenchmarkParseLarge(b *testing.B) {
	for _, file := range largeFiles() {
		b.Run(file.name, func(b *testing.B) {
			b.SetBytes(int64(len(file.data)))
			b.ReportAllocs()
			for b.Loop() {
				cfg, err := Parse(file.data)
				if err != nil {
					b.Fatal(err)
				}
				if len(cfg.Rules) != 100_000 {
					b.Fatalf("%d rules", len(cfg.Rules))
				}
			}
		})
	}
}

// BenchmarkValidateLarge validates 100k budgets and 100k rules built in code, as
// Engine.SetConfig does on every reload.
func BenchmarkValidateLarge(b *testing.B) {
	cfg, err := Parse(largeRulesFile(100_000))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := cfg.Validate(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkYAMLLarge is the floor under BenchmarkParseLarge: the YAML parser alone, which reads
// both files (JSON is YAML), into the node tree that Parse decodes.
func BenchmarkYAMLLarge(b *testing.B) {
	for _, file := range largeFiles() {
		b.Run(file.name, func(b *testing.B) {
			b.SetBytes(int64(len(file.data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := yamlTree(file.data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// largeFiles is a file of 100k budgets and 100k rules, as JSON and as YAML.
func largeFiles() []struct {
	name string
	data []byte
} {
	return []struct {
		name string
		data []byte
	}{{"json", largeRulesJSON(100_000)}, {"yaml", largeRulesFile(100_000)}}
}

// FuzzPlainDecimal: where the fast path reads a number, it reads what the YAML decoder reads.
func FuzzPlainDecimal(f *testing.F) {
	for _, s := range []string{"0", "4", "-3", "0.25", "010", "1_000", "0x1f", "1e3", ".5", "5.", "-0", "99999999999999999999", "+1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var n yaml.Node
		if yaml.Unmarshal([]byte("v: "+s), &n) != nil || len(n.Content) != 1 || len(n.Content[0].Content) != 2 {
			return
		}
		v := n.Content[0].Content[1]
		if v.Kind != yaml.ScalarNode || v.Value != s {
			return
		}
		if plainDecimal(s, false) && v.ShortTag() == "!!int" {
			var want int
			if v.Decode(&want) == nil {
				if got, err := strconv.Atoi(s); err != nil || got != want {
					t.Fatalf("int %q: fast path %d, %v; YAML %d", s, got, err, want)
				}
			}
		}
		if plainDecimal(s, true) && (v.ShortTag() == "!!int" || v.ShortTag() == "!!float") {
			var want float64
			if v.Decode(&want) == nil {
				if got, err := strconv.ParseFloat(s, 64); err != nil || got != want {
					t.Fatalf("float %q: fast path %v, %v; YAML %v", s, got, err, want)
				}
			}
		}
	})
}
