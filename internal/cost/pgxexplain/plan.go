package pgxexplain

import (
	"encoding/json"
	"errors"
	"math"
)

// errMalformedPlan reports EXPLAIN output without a usable total cost. Its text never quotes the
// output, which holds the statement's literals and parameter values.
var errMalformedPlan = errors.New("cost: explain returned no usable total cost")

// planCost returns the total planner cost in the output of EXPLAIN (FORMAT JSON), an array with
// one element per planned query: [{"Plan": {"Total Cost": 12.5, ...}, ...}]. A statement that
// rules rewrite into several queries yields several elements; their costs add up, because all of
// them run. Elements without a plan (a rule's utility statement) cost nothing; at least one plan
// is required. Keys match exactly, as PostgreSQL writes them, and only the top level of each plan
// is decoded: the plan tree below it stays raw bytes.
func planCost(out []byte) (float64, error) {
	var elems []json.RawMessage
	if err := json.Unmarshal(out, &elems); err != nil {
		return 0, errMalformedPlan
	}
	total, plans := 0.0, 0
	for _, raw := range elems {
		var el map[string]json.RawMessage
		if err := json.Unmarshal(raw, &el); err != nil {
			continue // valid JSON but not an object: no plan in this element
		}
		planRaw, ok := el["Plan"]
		if !ok {
			continue
		}
		var plan map[string]json.RawMessage
		if err := json.Unmarshal(planRaw, &plan); err != nil || plan == nil {
			return 0, errMalformedPlan
		}
		var cost *float64
		if err := json.Unmarshal(plan["Total Cost"], &cost); err != nil || cost == nil || *cost < 0 {
			return 0, errMalformedPlan
		}
		total += *cost
		plans++
	}
	if plans == 0 || math.IsInf(total, 0) {
		return 0, errMalformedPlan
	}
	return total, nil
}
