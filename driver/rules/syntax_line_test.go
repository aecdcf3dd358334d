package rules

import (
	"errors"
	"testing"
)

// TestSyntaxErrorNamesTheProblemLine: errors name the field and line (the package
// documentation), and a JSON file gives the same errors with lines. The YAML parser's errors (as opposed to its
// scanner's) name the line where the enclosing list or mapping began, counted from 0: taken as
// they are, a comma missing between two elements of a JSON list on line 6 would be reported on
// line 2 (the line before the list opens; the most common slip in a hand-edited JSON file), and
// the same slip in a YAML flow list opened on line 2 on line 1. Each case gives the range of
// lines an error could fairly name: from where the broken list opens to the problem.
func TestSyntaxErrorNamesTheProblemLine(t *testing.T) {
	for _, tc := range []struct {
		name   string
		file   string
		lo, hi int
	}{
		{"JSON list: a missing comma", "{\n" +
			"  \"server_cores\": 1,\n" +
			"  \"budgets\": [\n" +
			"    {\"name\": \"a\"},\n" +
			"    {\"name\": \"b\"}\n" + // line 5: the comma is missing here
			"    {\"name\": \"c\"}\n" + // line 6: where a JSON reader finds it
			"  ]\n}\n", 5, 6},
		{"YAML flow list: a missing comma", "server_cores: 1\n" +
			"budgets: [\n" + // line 2: the list opens
			"  {name: a},\n" +
			"  {name: b}\n" +
			"  {name: c}\n" + // line 5
			"]\n", 2, 5},
	} {
		_, err := Parse([]byte(tc.file))
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("%s: want an *Error, got %v", tc.name, err)
			continue
		}
		if e.Line < tc.lo || e.Line > tc.hi {
			t.Errorf("%s: %v\n\tnames line %d; want a line in %d..%d", tc.name, err, e.Line, tc.lo, tc.hi)
		}
	}
}

// TestSyntaxErrorMessages: a YAML parser error names its line counted from 1 and says when it is
// where the enclosing list or mapping begins; a problem at the end of the file is named on its
// last line of text; a file that is JSON in intent gets the JSON reader's position.
func TestSyntaxErrorMessages(t *testing.T) {
	for _, tc := range []struct{ name, file, want string }{
		{"flow list opened on line 2", "server_cores: 1\nbudgets: [\n  {name: a}\n  {name: b}\n]\n",
			"line 2: did not find expected ',' or ']' (in the list that begins on this line)"},
		{"flow list opened on line 1: the problem's line", "budgets: [\n  {name: a},\n  {name: b}\n  {name: c}\n]\n",
			"line 4: did not find expected ',' or ']' (in the list that begins on line 1)"},
		{"block list", "budgets:\n  - name: a\n    mode: warn\n   bad: 1\n",
			"line 2: did not find expected '-' indicator (in the list that begins on this line)"},
		{"block mapping", "budgets: []\n- b\n",
			"line 2: did not find expected key (in the mapping that begins on line 1)"},
		{"a list not closed", "budgets: []\nrules: [{budget: a, match: {app: x}}\n\n",
			"line 2: did not find expected ',' or ']' (in the list that begins on this line)"},
		{"a scanner error: its own line", "server_cores: 1\nbudgets:\n  - name: a\n  bad\n",
			"line 4: could not find expected ':'"},
		{"JSON: a comma missing between members", "{\n  \"server_cores\": 1\n  \"budgets\": []\n}\n",
			`line 3: column 3 (byte offset 24): invalid character '"' after object key:value pair (reading the file as JSON)`},
		{"JSON: not closed", "{\"budgets\": [\n  {\"name\": \"a\"}\n",
			"line 2: column 16 (byte offset 29): the JSON document ends before it is complete"},
		{"YAML in braces: the YAML parser's line, where JSON stops above it", "{server_cores: 1,\n budgets: [{name: a},\n  {name: b}\n  {name: c}]}\n",
			"line 2: did not find expected ',' or ']' (in the list that begins on this line)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.file))
			if want := "pgtraffic: rules " + tc.want; err == nil || err.Error() != want {
				t.Errorf("got  %v\nwant %s", err, want)
			}
		})
	}
}
