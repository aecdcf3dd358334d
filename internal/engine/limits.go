package engine

import (
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/budget"
)

// A zero limit (max_concurrent: 0, server_share: 0) closes its budget: it admits nothing, so that
// a rule to it blocks what the rule matches. internal/budget reads a zero as "no limit", so a
// closed budget is refused here, before its bucket and slots are asked.

// closedBy returns the refusal of a budget closed by a zero limit, without its rule and
// fingerprint, or nil when b admits statements. Waiting cannot open it: RetryAfter is zero.
func closedBy(b *rules.Budget) *Denial {
	switch {
	case b.MaxConcurrent != nil && *b.MaxConcurrent == 0:
		return &Denial{Budget: b.Name, Reason: vocab.ReasonConcurrency, Limit: budget.ConcurrencyLimit(0)}
	case b.ServerShare != nil && *b.ServerShare == 0:
		return &Denial{Budget: b.Name, Reason: vocab.ReasonBudget, Limit: budget.ShareLimit(0)}
	}
	return nil
}

// closedDenial returns bs's refusal at now of x, selected by rule, when bs is closed; else nil.
// No wait admits it, but a rule with an until selects it no more from then: its RetryAfter is
// the time left until the rule lapses (an incident's block for an hour), else 0.
func (bs *budgetState) closedDenial(st *compiled, rule int, x *Exec, now time.Time) *Denial {
	if bs.closed == nil {
		return nil
	}
	d := *bs.closed
	d.Rule, d.Fingerprint = st.ruleName[rule], x.Pattern.Fingerprint
	if st.until != nil && !st.until[rule].IsZero() {
		d.RetryAfter = max(st.until[rule].Sub(now), 0)
	}
	return &d
}

// deref returns *p, or the zero value for nil (an omitted limit: unlimited).
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
