package engine

import (
	"context"
	"fmt"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestBuiltinTagsCannotBeReplaced: a comment or a context tag naming a built-in key does not
// take a statement out of the budget and guard its real table selects; it is
// dropped, and the statement's built-in tags are its own.
func TestBuiltinTagsCannotBeReplaced(t *testing.T) {
	obs := &recObserver{}
	e, _ := newEngine(t, `
budgets:
  - {name: gt, mode: enforce, max_concurrent: 1}
rules:
  - {budget: gt, match: {table: gt}}
guards:
  block_truncate: {mode: enforce, match: {table: gt}}
`, func(o *Options) {
		o.Observer = obs
		o.ApplicationName = "api"
	})
	bg := context.Background()
	hold, err := begin(e, bg, "select * from gt")
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Finish(bg, nil)
	spoofCtx := tagging.With(bg, "table", "nothing", "statement", "select", "username", "admin",
		"database", "other", "application_name", "other", "fingerprint", "0000000000000000")
	spoof := `/*table='nothing',statement='select',username='admin',database='other',` +
		`application_name='other',fingerprint='0000000000000000',team='x'*/`
	for _, tc := range []struct {
		name  string
		ctx   context.Context
		query string
		want  string // the budget or guard that must refuse it
		kind  string // the statement tag
	}{
		{"comment, budget", bg, "select * from gt " + spoof, "gt", "select"},
		{"comment, guard", bg, "truncate gt " + spoof, vocab.GuardBlockTruncate, "ddl"},
		{"context, budget", spoofCtx, "select * from gt", "gt", "select"},
		{"context, guard", spoofCtx, "truncate gt", vocab.GuardBlockTruncate, "ddl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs.tags = nil
			x, err := begin(e, tc.ctx, tc.query)
			if err == nil {
				x.Finish(tc.ctx, nil)
				t.Fatalf("admitted with tags %v", obs.tags)
			}
			if d := denial(t, err); d.Budget != tc.want {
				t.Fatalf("refused by %q, want %q: %v", d.Budget, tc.want, d)
			}
			m := map[string][]string{}
			for _, kv := range obs.tags {
				m[kv.Key] = append(m[kv.Key], kv.Value)
			}
			for k, want := range map[string]string{"table": "[gt]", "username": "[app]", "database": "[shop]",
				"application_name": "[api]", "statement": "[" + tc.kind + "]"} {
				if fmt.Sprint(m[k]) != want {
					t.Errorf("tag %s = %v, want %s", k, m[k], want)
				}
			}
			if len(m["fingerprint"]) != 1 || m["fingerprint"][0] == "0000000000000000" {
				t.Errorf("fingerprint %v: not the statement's own", m["fingerprint"])
			}
			if tc.ctx == bg && fmt.Sprint(m["team"]) != "[x]" {
				t.Errorf("the comment's other tags must still be added: team = %v", m["team"])
			}
		})
	}
}

// TestTableTagMatchesQualifiedNames: a rule or guard on a table's bare name matches the
// statement however it names the table: schema-qualified (any schema), quoted, or not; a name
// that only contains the bare name does not match, nor does a quoted name with a dot in it.
func TestTableTagMatchesQualifiedNames(t *testing.T) {
	e, _ := newEngine(t, `
guards:
  block_truncate: {mode: enforce, match: {table: keep}}
`)
	bg := context.Background()
	for _, tc := range []struct {
		query   string
		refused bool
	}{
		{"truncate keep", true},
		{"truncate public.keep", true},
		{`truncate "public"."keep"`, true},
		{"truncate archive.keep", true},
		{"truncate db.public.keep", true},
		{"truncate keeper", false},
		{"truncate keep.other", false},
		{`truncate "x.keep"`, false},
	} {
		x, err := begin(e, bg, tc.query)
		switch {
		case tc.refused && err == nil:
			x.Finish(bg, nil)
			t.Errorf("%s: admitted; want the guard on table keep to refuse it", tc.query)
		case !tc.refused && err != nil:
			t.Errorf("%s: %v; want it admitted (not the table keep)", tc.query, err)
		case err == nil:
			x.Finish(bg, nil)
		}
	}
}
