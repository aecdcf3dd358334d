package rules

import (
	"strings"
	"testing"
)

// The built-in statement tag takes only the statement kinds, which are lowercase: a rule
// written {statement: DELETE} (as SQL is written) would match no statement, so an incident rule
// meant to block every DELETE would block none. The file is refused, naming the field.
func TestStatementMatchTakesOnlyKinds(t *testing.T) {
	for _, bad := range []string{"DELETE", "Delete", "drop", "select "} {
		_, err := Parse([]byte(`
budgets:
  - {name: b, mode: enforce, max_concurrent: 0}
rules:
  - {budget: b, match: {statement: "` + bad + `"}}
`))
		if err == nil || !strings.Contains(err.Error(), "rules[0].match.statement") || !strings.Contains(err.Error(), "delete") {
			t.Errorf("{statement: %q}: %v; want an error naming rules[0].match.statement and the kinds", bad, err)
		}
	}
	for _, ok := range []string{"delete", "select", "ddl", "other"} {
		if _, err := Parse([]byte(`
budgets:
  - {name: b, mode: enforce, max_concurrent: 0}
rules:
  - {budget: b, match: {statement: ` + ok + `}}
guards:
  require_where: {mode: enforce, match: {statement: ` + ok + `}}
`)); err != nil {
			t.Errorf("{statement: %s}: %v", ok, err)
		}
	}
}

// until 0001-01-01T00:00:00Z is Go's zero time, which means "no until": read as such, a rule
// its author meant lapsed long ago would stay in force. It is refused, naming the field.
func TestUntilZeroTimeRefused(t *testing.T) {
	for _, text := range []string{`
budgets:
  - {name: b, mode: enforce, max_concurrent: 0}
rules:
  - {budget: b, match: {app: x}, until: 0001-01-01T00:00:00Z}
`, `{"budgets": [{"name": "b", "mode": "enforce", "max_concurrent": 0}],
 "rules": [{"budget": "b", "match": {"app": "x"}, "until": "0001-01-01T00:00:00Z"}]}`} {
		_, err := Parse([]byte(text))
		if err == nil || !strings.Contains(err.Error(), "rules[0].until") || !strings.Contains(err.Error(), "zero time") {
			t.Errorf("until at the zero time: %v; want an error naming rules[0].until", err)
		}
	}
}
