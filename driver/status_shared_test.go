package driver

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestStatusSharedBudget: a shared budget's lease, instances and Redis state are on the status
// page and in the JSON, and the Redis URL's password is in neither. (Redis is unreachable here:
// a port nothing listens on; no statement runs, so nothing needs PostgreSQL either.)
func TestStatusSharedBudget(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cfg, err := ParseConfig([]byte(`
coordination: {redis: "redis://:hunter2@` + addr + `/0"}
budgets:
  - {name: s, mode: enforce, max_concurrent: 4}
  - {name: l, mode: enforce, max_concurrent: 4, shared: false}
`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConnector("postgres://u@127.0.0.1:1/db", WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	snap := c.Snapshot()
	if len(snap.Budgets) != 2 || snap.Budgets[0].Shared == nil || snap.Budgets[1].Shared != nil {
		t.Fatalf("budgets %+v: want s shared and l local", snap.Budgets)
	}
	if snap.Budgets[0].Shared.Instance == "" {
		t.Error("no instance id in the shared status")
	}
	js, _ := json.Marshal(snap)
	resp := statusGet(t, c.Handler(), http.MethodGet, "/", "text/html")
	body, _ := io.ReadAll(resp.Body)
	page := string(body)
	for _, want := range []string{`<table id="shared">`, `<td class="name">s</td><td class="n">`} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(page, `<td class="name">l</td><td class="n">`) {
		t.Error("the local budget is in the shared table")
	}
	for what, text := range map[string]string{"page": page, "json": string(js)} {
		if strings.Contains(text, "hunter2") {
			t.Errorf("the %s shows the Redis password", what)
		}
	}
	if !strings.Contains(string(js), `"shared":{"instance":`) {
		t.Errorf("JSON lacks the shared status: %s", js)
	}
}
