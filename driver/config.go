package driver

import (
	"context"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/engine"
)

// The rules types are defined, with every field documented, in package [rules]; these aliases
// let a program that imports only driver build a rules config in code:
//
//	cfg := &driver.Config{
//		Budgets: []driver.Budget{{Name: "reporting", Mode: driver.ModeEnforce, MaxConcurrent: new(4)}},
//		Rules:   []driver.Rule{{Budget: "reporting", Match: map[string]string{"app": "reporting"}}},
//	}
//	db, err := driver.Open(dsn, driver.WithConfig(cfg))
type (
	// Config is a rules file: budgets, the rules that select them, health throttling and
	// query guards. See [rules.Config].
	Config = rules.Config

	// Budget is one named set of limits of a [Config]. See [rules.Budget].
	Budget = rules.Budget

	// Rule routes the statements whose tags match all of its pairs to a budget. See [rules.Rule].
	Rule = rules.Rule

	// Guards are the static query guards of a [Config]. See [rules.Guards].
	Guards = rules.Guards

	// Guard is one query guard: its mode and optional tag scope. See [rules.Guard].
	Guard = rules.Guard

	// Mode is a budget's or guard's mode: [ModeEnforce], [ModeWarn] or [ModeOff].
	Mode = rules.Mode

	// Duration is a duration in a rules file, written like "250ms" or "2s". See [rules.Duration].
	Duration = rules.Duration
)

// Modes of a [Budget] or [Guard]. The empty Mode means warn for a budget and off for a guard.
const (
	ModeEnforce = rules.ModeEnforce // block the statement (a budget waits up to max_wait first)
	ModeWarn    = rules.ModeWarn    // log, count and annotate the span; let the statement run
	ModeOff     = rules.ModeOff     // ignore the budget or guard
)

// ParseConfig parses a rules file in YAML or JSON; it is [rules.Parse]. Unknown fields, unknown
// budget names, bad durations, bad CIDRs, duplicate budget names and out-of-range numbers are
// errors naming the field and the line.
func ParseConfig(data []byte) (*Config, error) { return rules.Parse(data) }

// WithGuardBypass returns a context whose statements skip the query guards (require_where,
// block_truncate), for deliberate bulk maintenance. Only code can set it: a SQL comment cannot,
// because comments can be injected.
func WithGuardBypass(ctx context.Context) context.Context { return engine.WithGuardBypass(ctx) }
