package runtime

import (
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver/rules"
)

// TestRejectedCoordinationKeepsSharing: a reload whose coordination URL passes
// rules.Parse but is refused when its client is made (an option go-redis does not know, in the
// query that Parse leaves to go-redis) is an error, and "on error the current rules stay". The
// rules in force share budget a through Redis; after the rejected reload they must still do so.
func TestRejectedCoordinationKeepsSharing(t *testing.T) {
	url := deadRedis(t)
	const budgets = `
budgets:
  - {name: a, mode: enforce, max_concurrent: 4}
rules:
  - {budget: a, match: {app: x}}
`
	r, _ := newRuntime(t, "coordination: {redis: \""+url+"\"}\n"+budgets)
	if st := r.Coordination(); len(st) != 1 || st[0].Name != "a" {
		t.Fatalf("shared budgets %+v before the reload, want a", st)
	}
	bad, err := rules.Parse([]byte("coordination: {redis: \"" + url + "?no_such_option=1\"}\n" + budgets))
	if err != nil {
		t.Fatalf("Parse refused the URL itself (%v): the scenario needs one that only go-redis refuses", err)
	}
	err = r.SetConfig(bad)
	if err == nil {
		t.Fatal("SetConfig accepted a URL go-redis refuses")
	}
	// It names the option (a name is no secret: it says what to fix), never the query as
	// written, whose values may be.
	if msg := err.Error(); strings.Contains(msg, "no_such_option=1") || !strings.Contains(msg, "no_such_option") {
		t.Errorf("the error quotes the URL's query, or does not name the option: %v", err)
	}
	if st := r.Coordination(); len(st) != 1 || st[0].Name != "a" {
		t.Fatalf("after the rejected reload the rules in force are no longer shared: coordination %+v, instance %q;"+
			" want budget a still shared (the last good rules stay)", st, r.Instance())
	}
	if b := r.Budgets(); len(b) != 1 || b[0].Shared == nil {
		t.Fatalf("budget a is process-local after the rejected reload: %+v", b)
	}
}
