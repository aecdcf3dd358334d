package pgxexplain

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
)

// A real EXPLAIN (FORMAT JSON) output from PostgreSQL 15, with literals in it.
const explainSeqScan = `[
  {
    "Plan": {
      "Node Type": "Seq Scan",
      "Parallel Aware": false,
      "Async Capable": false,
      "Relation Name": "t",
      "Alias": "t",
      "Startup Cost": 0.00,
      "Total Cost": 43746.34,
      "Plan Rows": 20000,
      "Plan Width": 41,
      "Filter": "(s = 'secret'::text)"
    }
  }
]`

func TestPlanCost(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    float64
		wantErr bool
	}{
		{"real output", explainSeqScan, 43746.34, false},
		{"minimal", `[{"Plan":{"Total Cost":12.5}}]`, 12.5, false},
		{"zero cost", `[{"Plan":{"Total Cost":0}}]`, 0, false},
		{"exponent", `[{"Plan":{"Total Cost":1.5e3}}]`, 1500, false},
		{"nested plans: the top total counts", `[{"Plan":{"Total Cost":100,"Plans":[{"Total Cost":60}]}}]`, 100, false},
		{"rules: several queries add up", `[{"Plan":{"Total Cost":10}},{"Plan":{"Total Cost":2.5}}]`, 12.5, false},
		{"a utility statement element costs nothing", `[{"Plan":{"Total Cost":10}},"Utility Statement"]`, 10, false},
		{"null element costs nothing", `[null,{"Plan":{"Total Cost":3}}]`, 3, false},
		{"keys match exactly", `[{"plan":{"Total Cost":1}}]`, 0, true},
		{"total cost key matches exactly", `[{"Plan":{"total cost":1}}]`, 0, true},
		{"empty array", `[]`, 0, true},
		{"not an array", `{"Plan":{"Total Cost":1}}`, 0, true},
		{"no plan", `[{"Query Text":"x"}]`, 0, true},
		{"plan without total cost", `[{"Plan":{"Startup Cost":1}}]`, 0, true},
		{"total cost is a string", `[{"Plan":{"Total Cost":"12"}}]`, 0, true},
		{"total cost is null", `[{"Plan":{"Total Cost":null}}]`, 0, true},
		{"negative total cost", `[{"Plan":{"Total Cost":-1}}]`, 0, true},
		{"plan is not an object", `[{"Plan":7}]`, 0, true},
		{"overflowing number", `[{"Plan":{"Total Cost":1e400}}]`, 0, true},
		{"costs overflow when added", `[{"Plan":{"Total Cost":1e308}},{"Plan":{"Total Cost":1e308}}]`, 0, true},
		{"truncated", `[{"Plan":{"Total Cost":1`, 0, true},
		{"empty", ``, 0, true},
		{"trailing garbage", `[{"Plan":{"Total Cost":1}}] x`, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := planCost([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("planCost error = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, errMalformedPlan) {
				t.Fatalf("error %v is not errMalformedPlan", err)
			}
			if got != tt.want {
				t.Fatalf("planCost = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestPlanCostErrorHidesOutput(t *testing.T) {
	_, err := planCost([]byte(`[{"Plan":{"Total Cost":"secret-literal"}}]`))
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("error %v must exist and not quote the output", err)
	}
}

func FuzzPlanCost(f *testing.F) {
	for _, s := range []string{
		explainSeqScan,
		`[{"Plan":{"Total Cost":12.5}}]`,
		`[{"Plan":{"Total Cost":10}},{"Plan":{"Total Cost":2.5}}]`,
		`[{"Plan":{"Total Cost":10}},"Utility Statement"]`,
		`[{"Plan":{"Total Cost":-1}}]`,
		`[{"Plan":{"Total Cost":"x"}}]`,
		`[{"Plan":7}]`,
		`[]`,
		`null`,
		`[{"Plan":{"Total Cost":1e308}},{"Plan":{"Total Cost":1e308}}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := planCost(in)
		if err != nil {
			if got != 0 || !errors.Is(err, errMalformedPlan) {
				t.Fatalf("planCost(%q) = %v, %v: an error must come with 0 and errMalformedPlan", in, got, err)
			}
			return
		}
		if math.IsNaN(got) || math.IsInf(got, 0) || got < 0 {
			t.Fatalf("planCost(%q) = %v, want a finite cost >= 0", in, got)
		}
		// Accepted input is valid JSON holding at least one plan, and the result is the sum of
		// the top-level plans' total costs.
		var generic []any
		if err := json.Unmarshal(in, &generic); err != nil {
			t.Fatalf("planCost accepted invalid JSON %q: %v", in, err)
		}
		sum, plans := 0.0, 0
		for _, el := range generic {
			obj, ok := el.(map[string]any)
			if !ok {
				continue
			}
			raw, ok := obj["Plan"]
			if !ok {
				continue
			}
			plan, ok := raw.(map[string]any)
			if !ok {
				t.Fatalf("planCost(%q) accepted a plan that is not an object", in)
			}
			c, ok := plan["Total Cost"].(float64)
			if !ok {
				t.Fatalf("planCost(%q) accepted a plan without a numeric total cost", in)
			}
			sum += c
			plans++
		}
		if plans == 0 || sum != got {
			t.Fatalf("planCost(%q) = %v; the plans' total costs add up to %v over %d plans", in, got, sum, plans)
		}
	})
}

// planCost is parsePlan's cost alone.
func planCost(out []byte) (float64, error) {
	p, err := parsePlan(out)
	return p.Cost, err
}

func TestParsePlanQueryIdentifier(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want int64
	}{
		{"reported", `[{"Plan":{"Total Cost":1},"Query Identifier":-4321987654321}]`, -4321987654321},
		{"not computed", `[{"Plan":{"Total Cost":1}}]`, 0},
		{"not an integer", `[{"Plan":{"Total Cost":1},"Query Identifier":"x"}]`, 0},
		{"several queries (a rule)", `[{"Plan":{"Total Cost":1},"Query Identifier":7},{"Plan":{"Total Cost":1},"Query Identifier":8}]`, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := parsePlan([]byte(tt.in))
			if err != nil || p.QueryID != tt.want {
				t.Fatalf("parsePlan = %+v, %v; want query identifier %d", p, err, tt.want)
			}
		})
	}
}
