package pgxexplain

import (
	"encoding/json"
	"errors"
	"math"

	"github.com/pgtraffic/pgtraffic/internal/cost"
)

// errMalformedPlan reports EXPLAIN output without a usable total cost. Its text never quotes the
// output, which holds the statement's literals and parameter values.
var errMalformedPlan = errors.New("cost: explain returned no usable total cost")

// parsePlan returns the total planner cost and the query identifier in the output of EXPLAIN
// (VERBOSE, FORMAT JSON), an array with one element per planned query:
// [{"Plan": {"Total Cost": 12.5, ...}, "Query Identifier": 123, ...}]. A statement that rules
// rewrite into several queries yields several elements; their costs add up, because all of them
// run, and its query identifier is left 0: no one query's counters describe it. Elements without
// a plan (a rule's utility statement) cost nothing; at least one plan is required. The query
// identifier is there only when the server computes one (compute_query_id, PostgreSQL 14+);
// else, or when it is not an integer, it is 0. Keys match exactly, as PostgreSQL writes them,
// and only the top level of each plan is decoded: the plan tree below it stays raw bytes.
func parsePlan(out []byte) (cost.Plan, error) {
	var elems []json.RawMessage
	if err := json.Unmarshal(out, &elems); err != nil {
		return cost.Plan{}, errMalformedPlan
	}
	total, plans := 0.0, 0
	var id int64
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
			return cost.Plan{}, errMalformedPlan
		}
		var c *float64
		if err := json.Unmarshal(plan["Total Cost"], &c); err != nil || c == nil || *c < 0 {
			return cost.Plan{}, errMalformedPlan
		}
		total += *c
		plans++
		id = 0
		if plans == 1 {
			_ = json.Unmarshal(el["Query Identifier"], &id) // absent or not an integer: 0
		}
	}
	if plans == 0 || math.IsInf(total, 0) {
		return cost.Plan{}, errMalformedPlan
	}
	return cost.Plan{Cost: total, QueryID: id}, nil
}
