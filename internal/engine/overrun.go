package engine

import (
	"errors"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"

	"github.com/pgtraffic/pgtraffic/internal/budget"
)

// max_duration bounds how long an admitted statement runs. The engine computes the bound at
// admission (Result.MaxDuration, from Start); the front end runs the statement, its rows
// included, under a context with that deadline and ErrOverrun as its cause, so that pgx cancels
// it on the server as for any deadline, and gives Finish an error matching ErrOverrun. A
// statement without a bound gets no context, no timer and no goroutine.

// ErrOverrun is the cause of the context of a statement that ran past its max_duration, and
// what the error of such a statement matches. The driver exports it as driver.ErrOverrun.
var ErrOverrun = errors.New("pgtraffic: statement ran past its budget's max_duration and was cancelled")

// noteBound takes bs, which has a max_duration and which rule r selected, into rt's smallest
// bounds.
func (rt *route) noteBound(bs *budgetState, r int) {
	switch bs.mode {
	case modeEnforce:
		if rt.bound == 0 || bs.maxDuration < rt.bound {
			rt.bound, rt.boundBy = bs.maxDuration, r
		}
	case modeWarn:
		if rt.warnBound == 0 || bs.maxDuration < rt.warnBound {
			rt.warnBound, rt.warnBoundBy = bs.maxDuration, r
		}
	}
}

// bind gives admitted x the bounds of rt.
func (x *Exec) bind(st *compiled, rt *route) {
	if r := rt.boundBy; rt.bound > 0 {
		x.MaxDuration, x.bound, x.boundRule = rt.bound, st.budgets[st.ruleBudget[r]], st.ruleName[r]
	}
	if r := rt.warnBoundBy; rt.warnBound > 0 {
		x.warnAfter, x.warnBound, x.warnRule = rt.warnBound, st.budgets[st.ruleBudget[r]], st.ruleName[r]
	}
}

// overran accounts, at x's Finish at now, for a run past a bound: a statement cancelled for
// its enforce budget's max_duration (err matches ErrOverrun) is counted and logged as that
// budget's block, reason max_duration; one that ran past a warn budget's is warned about. It
// reports the cancellation: the model still learns from it (what it ran is a lower bound).
func (e *Engine) overran(x *Exec, err error, took time.Duration, now time.Time) bool {
	// The warning first: a statement both warned about and cancelled is its budget's block,
	// which is the decision it ends with.
	if bs := x.warnBound; bs != nil && took > x.warnAfter {
		d := &Denial{Budget: bs.name, Rule: x.warnRule, Reason: vocab.ReasonMaxDuration, Fingerprint: x.Pattern.Fingerprint,
			Limit: "max_duration=" + bs.maxDuration.String()}
		bs.b.Count(now, budget.Warned, vocab.ReasonMaxDuration) // as the decisions metric counts it
		x.warnBudget(e, bs.name, d)
		if x.Wants&WantDecisions != 0 {
			e.obs.Decision(bs.name, DecisionWarn, vocab.ReasonMaxDuration)
		}
	}
	cancelled := x.bound != nil && errors.Is(err, ErrOverrun)
	if cancelled {
		bs := x.bound
		// The bound is the budget's max_duration, or a probe's (admission.go).
		d := &Denial{Budget: bs.name, Rule: x.boundRule, Reason: vocab.ReasonMaxDuration, Fingerprint: x.Pattern.Fingerprint,
			Limit: "max_duration=" + x.MaxDuration.String()}
		x.Decision, x.Reason, x.Blocker = DecisionBlock, vocab.ReasonMaxDuration, bs.name
		bs.b.Count(now, budget.Blocked, vocab.ReasonMaxDuration) // as the decisions metric counts it
		e.recordBlock(now, d, x.Pattern)
		e.logDecision(bs.name, DecisionBlock, d, x.Pattern)
		if x.Wants&WantDecisions != 0 {
			e.obs.Decision(bs.name, DecisionBlock, vocab.ReasonMaxDuration)
		}
	}
	return cancelled
}
