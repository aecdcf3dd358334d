package rules

import (
	"strings"
	"testing"
)

// TestExplicitEmptyModeIsAnError: a rules file rendered from a template whose variable was unset
// (mode: "{{ .Mode }}" becomes mode: "") must not run the budget (or guard) silently in its
// default mode, warn for a budget and off for a guard: an operator who meant enforce would get
// no error and nothing blocked. As per: "" is refused, and an explicit zero where zero would read
// as "no limit", a mode written as an empty string is an error naming the field and line; so is
// mode: with no value (envsubst of mode: $MODE), while mode: null omits it.
func TestExplicitEmptyModeIsAnError(t *testing.T) {
	for _, tc := range []struct{ file, field string }{
		{"budgets:\n  - name: reporting\n    mode: \"\"\n    max_concurrent: 4\n", "budgets[0].mode"},
		{`{"budgets": [{"name": "reporting", "mode": "", "max_concurrent": 4}]}`, "budgets[0].mode"},
		{"guards:\n  require_where: \"\"\n", "guards.require_where"},
	} {
		cfg, err := Parse([]byte(tc.file))
		if err == nil {
			mode := Mode("")
			if len(cfg.Budgets) > 0 {
				mode = cfg.Budgets[0].Mode
			} else {
				mode = cfg.Guards.RequireWhere.Mode
			}
			t.Errorf("%q: accepted, running in mode %q; want an error naming %s", tc.file, mode, tc.field)
			continue
		}
		if !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%q: error %q does not name %s", tc.file, err, tc.field)
		}
	}
}

// TestEmptyModeMessages: an empty mode or explain written in the file is refused on its line,
// in the short and the long form of a guard, and so is one written with no value (a template's
// unset variable); one left out, or written null, is the default, and so is an empty one in a
// config built in code.
func TestEmptyModeMessages(t *testing.T) {
	for _, tc := range []struct{ name, file, want string }{
		{"budget mode", "budgets:\n  - name: a\n    mode: ''\n",
			`pgtraffic: rules line 3: budgets[0].mode: must be enforce, warn or off (leave it out for the default), got ""`},
		{"explain", "budgets:\n  - name: a\n    explain: \"\"\n",
			`pgtraffic: rules line 3: budgets[0].explain: must be auto, pattern or call (leave it out for the default), got ""`},
		{"guard, short form", "guards:\n  block_truncate: ''\n",
			`pgtraffic: rules line 2: guards.block_truncate.mode: must be enforce, warn or off (leave it out for the default), got ""`},
		{"guard, long form", "guards:\n  require_where:\n    mode: ''\n    match: {app: web}\n",
			`pgtraffic: rules line 3: guards.require_where.mode: must be enforce, warn or off (leave it out for the default), got ""`},
		{"left out", "budgets: [{name: a}]\nguards: {require_where: {}}\n", ""},
		{"null", "budgets:\n  - name: a\n    mode: null\n    explain: ~\nguards:\n  require_where: null\n  block_truncate: {mode: null}\n", ""},
		{"guard with no value", "guards:\n  require_where:\n",
			`pgtraffic: rules line 2: guards.require_where: no value (an unset template variable?): write one, or leave the field out`},
		{"no value", "budgets:\n  - name: a\n    mode:\n    explain: ~\n",
			`pgtraffic: rules line 3: budgets[0].mode: no value (an unset template variable?): write one, or leave the field out`},
		{"limit with no value", "budgets:\n  - name: a\n    mode: enforce\n    max_concurrent:\n",
			`pgtraffic: rules line 4: budgets[0].max_concurrent: no value (an unset template variable?): write one, or leave the field out`},
		{"guard mode with no value", "guards:\n  block_truncate: {mode: }\n",
			`pgtraffic: rules line 2: guards.block_truncate.mode: no value (an unset template variable?): write one, or leave the field out`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tc.file))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "":
				if len(cfg.Budgets) > 0 && cfg.Budgets[0].Mode != ModeWarn || cfg.Guards.RequireWhere.Mode != ModeOff {
					t.Errorf("modes %q, %q; want the defaults", cfg.Budgets[0].Mode, cfg.Guards.RequireWhere.Mode)
				}
			case err == nil || err.Error() != tc.want:
				t.Errorf("got  %v\nwant %s", err, tc.want)
			}
		})
	}
	inCode := &Config{Budgets: []Budget{{Name: "a", Mode: "", Explain: ""}}, Guards: Guards{RequireWhere: Guard{Mode: ""}}}
	if err := inCode.Validate(); err != nil {
		t.Errorf("a config in code with empty modes (the defaults): %v", err)
	}
}
