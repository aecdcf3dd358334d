// Package ruleset compiles the rules of a config into an index that finds the rules matching
// a query's tags in time proportional to the number of tags, whatever the number of rules.
//
// It imports only driver/rules, whose rules it compiles, and the standard library.
//
// A [Set] is built once per config by [Compile] and is immutable: the engine swaps whole
// sets atomically on reload, and any number of goroutines may call [Set.Match] at once.
//
// # How matching works
//
// Each rule is filed under one of its pairs, the candidate pair: a rule can only match
// when that pair holds, so looking up each of a query's tags finds every rule that might.
// Exact pairs are looked up in a map keyed by the pair. CIDR pairs are looked up once per
// mask length configured for the tag's key: the tag's address, masked to that length, is
// the map key, so every prefix containing the address is found, the longest and all others.
// A candidate with more than one pair (a conjunction) is then checked whole.
package ruleset
