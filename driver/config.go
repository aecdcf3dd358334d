package driver

import (
	"context"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/engine"
)

// Config is a rules file: budgets, the rules that select them, and query guards. Build one in
// code or with [ParseConfig]; see the README for every field.
type Config = rules.Config

// Budget is one budget of a [Config].
type Budget = rules.Budget

// Rule selects a budget for the statements whose tags match all of its pairs.
type Rule = rules.Rule

// Guards are the static query guards of a [Config].
type Guards = rules.Guards

// Guard is one query guard: its mode and optional tag scope.
type Guard = rules.Guard

// Mode is a budget's or guard's mode: "enforce", "warn" or "off".
type Mode = rules.Mode

// Duration is a duration in a rules file, written like "250ms" or "2s".
type Duration = rules.Duration

// ParseConfig parses a rules file in YAML or JSON. Unknown fields, unknown budget names, bad
// durations, bad CIDRs, duplicate budget names and out-of-range numbers are errors naming the
// field and line.
func ParseConfig(data []byte) (*Config, error) { return rules.Parse(data) }

// WithGuardBypass returns a context whose statements skip the query guards (require_where,
// block_truncate), for deliberate bulk maintenance. Only code can set it: a SQL comment cannot,
// because comments can be injected.
func WithGuardBypass(ctx context.Context) context.Context { return engine.WithGuardBypass(ctx) }
