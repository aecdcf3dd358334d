package rules_test

import (
	"fmt"
	"os"

	"github.com/pgtraffic/pgtraffic/driver/rules"
)

func ExampleParse() {
	cfg, err := rules.Parse([]byte(`
server_cores: 8
budgets:
  - name: reporting
    mode: enforce
    max_concurrent: 4
    server_share: 0.25
rules:
  - budget: reporting
    match: {app: reporting}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	b := cfg.Budgets[0]
	fmt.Println(b.Name, b.Mode, *b.MaxConcurrent, b.Explain)
	fmt.Println(cfg.Rules[0].String())
	// The defaults that follow other fields (burst_limit follows server_share and server_cores)
	// are left omitted; WithDefaults shows them.
	fmt.Println(b.BurstLimit, cfg.WithDefaults().Budgets[0].BurstLimit)
	// Output:
	// reporting enforce 4 auto
	// app=reporting
	// 0s 2s
}

func ExampleParse_errors() {
	_, err := rules.Parse([]byte(`
budgets:
  - name: reporting
    max_concurent: 4
    server_share: 1.5
rules:
  - budget: reportng
    match: {remote_address: 203.0.113.0/33}
`))
	fmt.Println(err)
	// Output:
	// pgtraffic: rules line 4: budgets[0].max_concurent: unknown field (did you mean max_concurrent?)
	// pgtraffic: rules line 5: budgets[0].server_share: must be in [0, 1], got 1.5
	// pgtraffic: rules line 7: rules[0].budget: unknown budget "reportng"
	// pgtraffic: rules line 8: rules[0].match.remote_address: invalid CIDR prefix "203.0.113.0/33"
}

func ExampleConfig_Validate() {
	cfg := &rules.Config{
		Budgets: []rules.Budget{{Name: "reporting", ServerShare: new(float64(1.5))}},
		Rules:   []rules.Rule{{Budget: "reportng", Match: map[string]string{"app": "reporting"}}},
	}
	fmt.Println(cfg.Validate())
	// Output:
	// pgtraffic: rules: budgets[0].server_share: must be in [0, 1], got 1.5
	// pgtraffic: rules: rules[0].budget: unknown budget "reportng"
}

// The complete rules file in testdata/full.yaml uses every field; testdata/full.json is the
// same file in JSON.
func ExampleParse_file() {
	data, err := os.ReadFile("testdata/full.yaml")
	if err != nil {
		fmt.Println(err)
		return
	}
	cfg, err := rules.Parse(data)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, b := range cfg.WithDefaults().Budgets { // burst_limit's default included
		fmt.Printf("%s: %s, burst %v, throttle %v\n", b.Name, b.Mode, b.BurstLimit, b.ThrottleWhen)
	}
	for _, r := range cfg.Rules {
		fmt.Printf("%s -> %s\n", r.String(), r.Budget)
	}
	fmt.Println("require_where:", cfg.Guards.RequireWhere.Mode)
	// Output:
	// reporting: enforce, burst 10s, throttle map[active_queries:50 custom.locks:20 replication_lag:5]
	// per-tenant: warn, burst 400ms, throttle map[]
	// batch: enforce, burst 0s, throttle map[in_flight:16 replication_lag:1.5]
	// app=reporting -> reporting
	// app=commerce,controller=export -> reporting
	// remote_address=203.0.113.0/24 -> per-tenant
	// application_name=nightly-etl,table=orders -> batch
	// require_where: enforce
}
