package rules

import (
	"reflect"
	"strings"
	"testing"
)

// A JSON file is read as the YAML it is: its problems name their lines as in any file.
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
