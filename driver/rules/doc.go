// Package rules defines the pgtraffic rules file — budgets, the rules that route queries to
// them, health throttling and static guards — and parses it strictly from YAML or JSON.
//
// # Parsing
//
// [Parse] reads one YAML document (JSON is accepted as the YAML subset it is). Decoding is
// strict: unknown fields, duplicate keys, values of the wrong type, bad durations, bad CIDRs,
// out-of-range numbers and rules naming unknown budgets are all errors, each naming the field
// path in rules-file spelling and the line it is on:
//
//	pgtraffic: rules line 7: budgets[1].max_concurent: unknown field (did you mean max_concurrent?)
//
// Every problem found is reported, joined with [errors.Join]; each is an [*Error], and
// errors.Is(err, [ErrInvalid]) holds for all of them.
//
// # Configs built in code
//
// A [Config] built in code gets the same checks from [Config.Validate], with the same field
// paths and no line numbers. In code, a zero field means "omitted": no limit, or the default.
// In a file an explicit zero is rejected where it would mean "no limit" (max_concurrent: 0,
// per_query_limit: 0s, ...), because a reader could take it for "nothing allowed".
//
// # Defaults
//
// [Parse] returns a config with defaults filled in ([Config.WithDefaults]): server_cores 1,
// health_interval 1s, budget mode warn, explain auto, burst_limit share × cores × 1s, guard
// mode off. Validate never modifies its receiver.
package rules
