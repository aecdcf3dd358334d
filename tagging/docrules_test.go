package tagging_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// The package documentation's "HTTP requests" section tells a user to register Middleware inside
// a ServeMux (mux.Handle("GET /orders/{id}", tagging.Middleware(ordersHandler))) and then to
// write rules such as `match: {route: "/orders/{id}"}`. A user copies that rule into the rules
// file and expects it to load and to select the queries that handler runs. Unquoted, the route
// is not valid YAML (`{` and `}` are flow indicators inside a flow mapping): the rules file
// would be refused, the connector would not open, and on a reload the last good rules would
// stay. The test reads the rule from doc.go itself and checks that it parses and matches the
// route tag Middleware sets.
func TestDocumentedRouteRuleParses(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	// The documented rule, as written in the package documentation (one comment line).
	m := regexp.MustCompile(`match: (\{route: [^\n]*?\}) or match:`).FindSubmatch(doc)
	if m == nil {
		t.Fatal("doc.go no longer documents a rule matching the route tag: update this test")
	}
	match := string(m[1])
	file := "budgets:\n  - name: web\nrules:\n  - budget: web\n    match: " + match + "\n"
	cfg, err := rules.Parse([]byte(file))
	if err != nil {
		t.Fatalf("the rule the tagging documentation gives, match: %s, is refused by the rules parser:\n%v", match, err)
	}

	// And it selects the requests of the documented handler: the route tag Middleware sets.
	var route string
	mux := http.NewServeMux()
	mux.Handle("GET /orders/{id}", tagging.Middleware(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		route, _ = tagging.From(r.Context()).Get("route")
	})))
	mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/orders/7", nil))
	if got := cfg.Rules[0].Match["route"]; got != route {
		t.Errorf("the documented rule matches route %q; Middleware tags the request with route %q", got, route)
	}
}
