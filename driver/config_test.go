package driver_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
)

// A program that imports only driver builds a rules config in code with the exported modes,
// and the connector takes it as written.
func TestConfigInCode(t *testing.T) {
	cfg := &driver.Config{
		Budgets: []driver.Budget{{Name: "reporting", Mode: driver.ModeEnforce, MaxConcurrent: new(4),
			PerQueryLimit: driver.Duration(2e9)}},
		Rules:  []driver.Rule{{Budget: "reporting", Match: map[string]string{"app": "reporting"}}},
		Guards: driver.Guards{RequireWhere: driver.Guard{Mode: driver.ModeWarn}},
	}
	c, err := driver.NewConnector("postgres://app@localhost/shop", driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	budgets := c.Snapshot().Budgets
	if len(budgets) != 1 || budgets[0].Name != "reporting" || budgets[0].Mode != string(driver.ModeEnforce) {
		t.Errorf("budgets in force: %+v", budgets)
	}
}

// BenchmarkApplyLargeRules parses a rules file of 100k budgets and 100k rules and puts it in
// force, as a connector does on start and on every reload of the file: written as JSON, as such
// a file usually is (generated), and as YAML.
func BenchmarkApplyLargeRules(b *testing.B) {
	const n = 100_000
	var js, ys strings.Builder
	js.WriteString("{\"server_cores\": 64,\n\"budgets\": [\n")
	ys.WriteString("server_cores: 64\nbudgets:\n")
	for i := range n {
		if i > 0 {
			js.WriteString(",\n")
		}
		fmt.Fprintf(&js, `  {"name": "tenant-%d", "mode": "enforce", "max_concurrent": 4, "server_share": 0.001}`, i)
		fmt.Fprintf(&ys, "  - {name: tenant-%d, mode: enforce, max_concurrent: 4, server_share: 0.001}\n", i)
	}
	js.WriteString("],\n\"rules\": [\n")
	ys.WriteString("rules:\n")
	for i := range n {
		if i > 0 {
			js.WriteString(",\n")
		}
		fmt.Fprintf(&js, `  {"budget": "tenant-%d", "match": {"app": "shop", "tenant": "t%d"}}`, i, i)
		fmt.Fprintf(&ys, "  - {budget: tenant-%d, match: {app: shop, tenant: t%d}}\n", i, i)
	}
	js.WriteString("]}\n")
	for _, file := range []struct{ name, data string }{{"json", js.String()}, {"yaml", ys.String()}} {
		b.Run(file.name, func(b *testing.B) {
			data := []byte(file.data)
			c, err := driver.NewConnector("postgres://app@localhost/shop")
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			b.ReportAllocs()
			for b.Loop() {
				cfg, err := driver.ParseConfig(data)
				if err != nil {
					b.Fatal(err)
				}
				if err := c.SetConfig(cfg); err != nil {
					b.Fatal(err)
				}
			}
			if got := len(c.Snapshot().Budgets); got != n {
				b.Fatalf("%d budgets in force, want %d", got, n)
			}
		})
	}
}
