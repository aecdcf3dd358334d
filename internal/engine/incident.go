package engine

import "time"

// Quarantine is a pattern that a budget refuses until a time (reason quarantine).
type Quarantine struct {
	Budget      string
	Fingerprint string
	Query       string // normalised text
	Until       time.Time
}

// RuleExpiry is a rule in force that stops selecting statements at a time (its until).
type RuleExpiry struct {
	Budget string
	Rule   string // as in a refusal's Rule: "app=reporting,controller=export"
	Until  time.Time
}

// Quarantines reports the patterns quarantined now, each with the budget that quarantined it
// and when the quarantine ends. No budget quarantines yet, so it reports none.
func (e *Engine) Quarantines() []Quarantine { return nil }

// RuleExpiries reports the rules in force that expire, each with its budget and expiry, in
// rules-file order. No rule expires yet, so it reports none.
func (e *Engine) RuleExpiries() []RuleExpiry { return nil }
