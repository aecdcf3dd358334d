package integration

import (
	"context"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestGuardWarnOnRefusedStatement: a warn-mode guard notes what enforce would refuse of what
// runs, as a warn budget does. An UPDATE without WHERE under `require_where: warn`, selected by
// an enforce budget that refuses it (max_concurrent: 0), never runs: no require_where warning is
// counted in pgtraffic.decisions that its span does not carry as a pgtraffic.warn event (none
// is, and no log line says "it runs"), on both front ends.
func TestGuardWarnOnRefusedStatement(t *testing.T) {
	const rules = `
budgets:
  - {name: closed, mode: enforce, max_concurrent: 0}
rules:
  - {budget: closed, match: {app: y}}
guards: {require_where: warn}
`
	check := func(t *testing.T, front string, metricWarns int64, spans []spanEvents, log string) {
		t.Helper()
		var events int64
		for _, sp := range spans {
			for _, e := range sp.events {
				if e == "require_where" {
					events++
				}
			}
		}
		if metricWarns != events {
			t.Errorf("%s: pgtraffic.decisions counts %d require_where warning(s) for one refused statement, "+
				"its span carries %d pgtraffic.warn event(s) naming require_where; the README says a warning is "+
				"counted AND marked with the event (log says: %s)", front, metricWarns, events, log)
		}
	}

	t.Run("database/sql", func(t *testing.T) {
		s := newTelSetup(t, rules)
		_, err := s.db.ExecContext(tagging.With(context.Background(), "app", "y"), "update orders set note = $1", "a")
		asBlocked(t, err)
		d := telDecisions(t, s.metrics(t))
		check(t, "database/sql", d["require_where/warn/guard"], telSpanEvents(s.spans.GetSpans()), guardLog(s.log.String()))
	})
	t.Run("pool", func(t *testing.T) {
		p, spans, ps := telPool(t, "", rules)
		if _, err := p.Exec(context.Background(), "create table orders (id int, note text)"); err != nil {
			t.Fatal(err)
		}
		spans.Reset()
		_, err := p.Exec(tagging.With(context.Background(), "app", "y"), "update orders set note = $1", "a")
		asBlocked(t, err)
		d := telDecisions(t, ps.metrics(t))
		check(t, "pool", d["require_where/warn/guard"], telSpanEvents(spans.GetSpans()), "(default logger)")
	})
}

func guardLog(log string) string {
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "require_where") {
			return l
		}
	}
	return "(no line)"
}
