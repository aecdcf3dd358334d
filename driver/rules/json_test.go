package rules

import (
	"bytes"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// JSON files are read by jsonTree, everything else by the YAML parser; both must say the same
// about a file, lines included.
func TestJSONErrorsNameTheirLine(t *testing.T) {
	tests := []struct {
		name, file, want string
	}{
		{"unknown field", "{\n  \"budgets\": [\n    {\"name\": \"a\", \"max_concurent\": 4}\n  ]\n}",
			"rules line 3: budgets[0].max_concurent: unknown field (did you mean max_concurrent?)"},
		{"duplicate key", "{\"server_cores\": 2,\n\"server_cores\": 3}",
			"rules line 2: server_cores: duplicate key (first on line 1)"},
		{"explicit zero", "{\"budgets\": [\n{\"name\": \"a\",\n \"max_duration\": \"0s\"}]}",
			"rules line 3: budgets[0].max_duration: must be > 0"},
		{"null in a match", "{\"budgets\": [{\"name\": \"a\"}],\r\n\"rules\": [{\"budget\": \"a\", \"match\": {\"app\": null}}]}",
			"rules line 2: rules[0].match.app: expected a string, got null"},
		{"lone carriage returns", "{\r\"budgets\": [{\"name\": \"a\"}],\r\"rules\": [{\"budget\": \"b\", \"match\": {\"app\": \"x\"}}]}",
			"rules line 3: rules[0].budget: unknown budget \"b\""},
		{"line separator in a string", "{\"health_queries\": {\"q\": \"select\u2028 1\"},\n\"server_cores\": -1}",
			"rules line 3: server_cores: must be a number > 0"},
		{"invalid JSON goes to the YAML parser", "{\"server_cores\": [2}", "rules line 1"},
		{"invalid UTF-8", "{\"budgets\": [{\"name\": \"a\xff\"}]}", "rules line 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.file))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// A JSON file reads as the YAML parser reads it: numbers keep YAML's tags, escapes are JSON's.
func TestJSONTree(t *testing.T) {
	root, ok := jsonTree([]byte(`{"a": [1, -0.5, 1e3, 99999999999999999999, true, null], "b": "\u00e9\ud83d\ude00\/\"\\"}`))
	if !ok {
		t.Fatal("valid JSON refused")
	}
	seq := root.Content[1]
	var tags []string
	for _, n := range seq.Content {
		tags = append(tags, n.ShortTag()+" "+n.Value)
	}
	want := []string{"!!int 1", "!!float -0.5", "!!float 1e3", "!!float 99999999999999999999", "!!bool true", "!!null null"}
	if !reflect.DeepEqual(tags, want) {
		t.Errorf("scalars %q, want %q", tags, want)
	}
	if got := root.Content[3].Value; got != "é😀/\"\\" {
		t.Errorf("escaped string %q", got)
	}
	for _, bad := range []string{"", "{", "{} {}", "{\"a\": 1,}", "\xef\xbb\xbf{}", "{\"a\": \"\xff\"}", "{\"a\": \"\t\"}"} {
		if _, ok := jsonTree([]byte(bad)); ok {
			t.Errorf("jsonTree accepted %q", bad)
		}
	}
}

// FuzzJSONTree: for every file that is JSON and that the YAML parser also reads, the two trees
// are the same, and so is what Parse makes of them, errors included.
func FuzzJSONTree(f *testing.F) {
	data, err := os.ReadFile("testdata/full.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	for _, s := range []string{
		"{}", "[]", "null", "1", `"x"`, `{"a":1}`, "{\"a\":\r1,\r\"b\":\r\n2}", "{\t\"a\"\t:\t[1e3, -0, 1.5E-3]}",
		"{\"a\": \"x\u2028y\u0085z\",\n\"b\": 1}", "{\" \u2028 \": \"a \u2028\\u0020\u2029 \\u2028 \"}", `{"a": "\u0000\n\t\u00e9"}`, `{"a": {"a": 1, "a": 2}}`,
		`{"budgets": [{"name": "a", "max_concurrent": 0, "server_share": 0.5}], "rules": [{"budget": "a", "match": {"port": 5432}}]}`,
		`{"guards": {"require_where": "warn", "block_truncate": {"mode": "enforce", "match": {"app": "x"}}}}`,
		`{"server_cores": 99999999999999999999, "health_interval": 2}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fromJSON, ok := jsonTree(data)
		if !ok {
			return
		}
		fromYAML, err := yamlTree(data)
		if err != nil {
			return // JSON the YAML parser refuses (an escaped /, a long key): only jsonTree reads it
		}
		if strings.Contains(string(data), "\u0085") {
			return // the YAML parser folds a NEL in a string into a space; JSON keeps it
		}
		if folded := foldBlanksAtBreaks(data); !bytes.Equal(folded, data) {
			if fromJSON, ok = jsonTree(folded); !ok {
				t.Fatalf("jsonTree refused %q once blanks at separators were removed", folded)
			}
		}
		if diff := sameTree(fromJSON, fromYAML, "$"); diff != "" {
			t.Fatalf("trees differ at %s", diff)
		}
		c1, err1 := decode(fromJSON)
		c2, err2 := decode(fromYAML)
		if !reflect.DeepEqual(c1, c2) || errText(err1) != errText(err2) {
			t.Fatalf("JSON read: %v %v\nYAML read: %v %v", c1, err1, c2, err2)
		}
	})
}

// blanksAtBreaks matches a line or paragraph separator (LS, PS) written as such, not escaped,
// with the spaces and tabs around it and any separators and blanks that follow.
var blanksAtBreaks = regexp.MustCompile("[ \t]*[\u2028\u2029][\u2028\u2029 \t]*")

// foldBlanksAtBreaks returns the file with the blanks around each unescaped LS or PS removed.
// In a double-quoted string the YAML parser keeps the separator but, as at any line break,
// drops those blanks; JSON keeps them, as jsonTree does. Unescaped, a separator is valid JSON
// only inside a string, and removing blanks moves no line.
func foldBlanksAtBreaks(data []byte) []byte {
	return blanksAtBreaks.ReplaceAllFunc(data, func(run []byte) []byte {
		return bytes.Map(func(r rune) rune {
			if r == ' ' || r == '\t' {
				return -1
			}
			return r
		}, run)
	})
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// sameTree compares what decoding reads of two trees: kinds, tags, values, styles and lines
// (columns are not set from JSON). It returns where they first differ, or "".
func sameTree(a, b *yaml.Node, at string) string {
	if a.Kind != b.Kind || a.ShortTag() != b.ShortTag() || a.Value != b.Value || a.Style != b.Style ||
		a.Line != b.Line || len(a.Content) != len(b.Content) {
		return at + ": " + describeNode(a) + " vs " + describeNode(b)
	}
	for i := range a.Content {
		if d := sameTree(a.Content[i], b.Content[i], at+"/"+describeNode(a.Content[i])); d != "" {
			return d
		}
	}
	return ""
}

func describeNode(n *yaml.Node) string {
	return fmt.Sprintf("%s %q line %d style %d len %d", n.ShortTag(), n.Value, n.Line, n.Style, len(n.Content))
}

// JSON's escaped slash, which some encoders write for every /, reads as the slash: YAML has no
// such escape.
func TestJSONEscapedSlash(t *testing.T) {
	cfg, err := Parse([]byte(`{"budgets": [{"name": "a"}],
"rules": [{"budget": "a", "match": {"route": "\/api\/export", "path": "c:\\\/x", "q": "\\\\\/"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"route": "/api/export", "path": `c:\/x`, "q": `\\/`}
	if got := cfg.Rules[0].Match; !reflect.DeepEqual(got, want) {
		t.Errorf("match %q, want %q", got, want)
	}
	// Not JSON: YAML reads \/ as the error it is there.
	if _, err := Parse([]byte("budgets: [{name: \"a\\/b\"}]\n")); err == nil {
		t.Error("YAML with \\/ accepted")
	}
}
