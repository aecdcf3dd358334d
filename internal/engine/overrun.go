package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"

	"github.com/pgtraffic/pgtraffic/internal/budget"
)

// max_duration bounds how long an admitted statement runs. The engine computes the bound at
// admission (Result.MaxDuration, from Start); the front end runs the statement, its rows
// included, under a context with that deadline and the bound's cause (Exec.Overrun: an error
// matching ErrOverrun that names the budget and the bound), so that pgx cancels it on the
// server as for any deadline, and gives Finish an error matching ErrOverrun. A statement
// without a bound gets no context, no timer and no goroutine. A bound applies from the
// statement's admission: a reload that changes max_duration bounds the statements admitted
// after it, as a change of PostgreSQL's statement_timeout bounds the statements that start
// after it.

// ErrOverrun is what the cause of the context of a statement that ran past its max_duration,
// and the error of such a statement, match. The driver exports it as driver.ErrOverrun.
var ErrOverrun = errors.New("pgtraffic: statement ran past its budget's max_duration and was cancelled")

// OverrunCause is the cause of the context of a statement bounded by budget's max_duration
// bound (a probe's bound is its smallest limit: admission.go). It matches ErrOverrun and names
// the budget and the bound, so that the statement's caller can tell which of its budgets cut it
// off.
type OverrunCause struct {
	budget string
	bound  time.Duration
}

func (c *OverrunCause) Error() string {
	return fmt.Sprintf("pgtraffic: statement ran past budget %q's max_duration=%s and was cancelled", c.budget, c.bound)
}

func (c *OverrunCause) Is(target error) bool { return target == ErrOverrun }

// Deadline is when admitted x's MaxDuration ends, counted from its Start, and the cause the
// front end gives the context it runs x under (Overrun); ok is false when x has no bound.
func (x *Exec) Deadline() (deadline time.Time, cause error, ok bool) {
	if x.MaxDuration <= 0 {
		return time.Time{}, nil, false
	}
	return x.start.Add(x.MaxDuration), x.overrun, true // set with MaxDuration (bind, probeBound)
}

// Overrun returns the cause the front end gives the context of x, admitted with a MaxDuration:
// an error matching ErrOverrun that names the budget and the bound. Nil when x has no bound.
func (x *Exec) Overrun() error {
	if x.bound == nil {
		return nil
	}
	return x.overrun
}

// noteBound takes bs, which has a max_duration and which rule r selected, into rt's bounds: the
// smallest of its enforce budgets', which cuts the statement off, and each of its warn
// budgets', each of which warns about a statement that ran past it.
func (rt *route) noteBound(bs *budgetState, r int) {
	switch bs.mode {
	case modeEnforce:
		if rt.bound == 0 || bs.maxDuration < rt.bound {
			rt.bound, rt.boundBy = bs.maxDuration, r
		}
	case modeWarn:
		rt.warnBounds = append(rt.warnBounds, owner{bs: bs, rule: r})
	}
}

// bind gives admitted x the bounds of rt.
func (x *Exec) bind(st *compiled, rt *route) {
	if r := rt.boundBy; rt.bound > 0 {
		bs := st.budgets[st.ruleBudget[r]]
		x.MaxDuration, x.bound, x.boundRule, x.overrun = rt.bound, bs, st.ruleName[r], bs.overrun
	}
	for _, o := range rt.warnBounds {
		x.warnBounds = append(x.warnBounds, warnBound{bs: o.bs, rule: st.ruleName[o.rule]})
	}
}

// warnBound is a warn budget with a max_duration of an admitted statement, and the name of the
// rule that selected it.
type warnBound struct {
	bs   *budgetState
	rule string
}

// overran accounts, at x's Finish at now, for a run past a bound: a statement cancelled for
// its enforce budget's max_duration (cancelled: x.cutOff) is counted and logged as that
// budget's block, reason max_duration; one that ran past a warn budget's is warned about by
// that budget, by each such budget.
func (e *Engine) overran(x *Exec, cancelled bool, took time.Duration, now time.Time) {
	// The warnings first: a statement both warned about and cancelled is its budget's block,
	// which is the decision it ends with.
	for _, w := range x.warnBounds {
		bs := w.bs
		if took <= bs.maxDuration {
			continue
		}
		d := &Denial{Budget: bs.name, Rule: w.rule, Reason: vocab.ReasonMaxDuration,
			Fingerprint: x.Pattern.Fingerprint, Limit: maxDurationLimit(bs.maxDuration)}
		bs.b.Count(now, budget.Warned, vocab.ReasonMaxDuration) // as the decisions metric counts it
		x.warnBudget(e, bs.name, d)
		if x.Wants&WantDecisions != 0 {
			e.obs.Decision(bs.name, DecisionWarn, vocab.ReasonMaxDuration)
		}
	}
	if cancelled {
		// The bound is the budget's max_duration, or a probe's (admission.go).
		e.blockOverrun(x, x.bound, x.boundRule, x.MaxDuration, now)
		if x.Wants&WantDecisions != 0 {
			e.obs.Decision(x.bound.name, DecisionBlock, vocab.ReasonMaxDuration)
		}
	}
}

// cutOff reports whether x, which ended with err, was cancelled by its own bound (its enforce
// budget's max_duration, or a probe's): a batch runs under its statements' smallest bound,
// which cuts off with them the statements of a longer one, whose budget did not (the cause,
// when err carries it, names the bound). The model still learns from such a statement: what it
// ran is a lower bound.
func (x *Exec) cutOff(err error) bool {
	if x.bound == nil || !errors.Is(err, ErrOverrun) {
		return false
	}
	var cause *OverrunCause
	return !errors.As(err, &cause) || cause == x.overrun
}

// blockOverrun counts and logs x, cut off by bs's max_duration bound (selected by rule), as
// bs's block, reason max_duration, and marks x so. The observer counts it as the caller says:
// at Finish (overran) by Decision, or, for a statement answered by Begin (its EXPLAIN cut off),
// by Blocked, which counts a statement marked blocked.
func (e *Engine) blockOverrun(x *Exec, bs *budgetState, rule string, bound time.Duration, now time.Time) {
	d := &Denial{Budget: bs.name, Rule: rule, Reason: vocab.ReasonMaxDuration, Fingerprint: x.Pattern.Fingerprint,
		Limit: maxDurationLimit(bound)}
	x.Decision, x.Reason, x.Blocker = DecisionBlock, vocab.ReasonMaxDuration, bs.name
	bs.b.Count(now, budget.Blocked, vocab.ReasonMaxDuration) // as the decisions metric counts it
	e.recordBlock(now, d, x.Pattern)
	e.logDecision(bs.name, DecisionBlock, d, x.Pattern)
}

// maxDurationLimit is a max_duration bound as a Denial's Limit names it.
func maxDurationLimit(bound time.Duration) string {
	return vocab.FieldMaxDuration + "=" + bound.String()
}

// explainContext returns ctx bounded by rt's max_duration (its enforce budgets' smallest), for
// the EXPLAIN of a statement routed by rt under st, and what releases it: the EXPLAIN comes
// before the statement's admission, but a statement that waits longer than its max_duration
// for its plan (a lock a migration holds, a slow planner) would run past it, and the caller who
// set max_duration as a client-side statement_timeout expects it cut off, as the server's
// statement_timeout cuts off an EXPLAIN. A reload ends it too, its cause errRulesChanged: the
// statement is decided again under the rules in force, so that one an incident's rule blocks
// does not wait for a lock in its EXPLAIN, holding its connection, until the lock goes.
func (e *Engine) explainContext(ctx context.Context, st *compiled, rt *route) (context.Context, context.CancelFunc) {
	ectx, cancel := context.WithCancelCause(ctx)
	bounded, stop := ectx, context.CancelFunc(func() {})
	if rt.bound > 0 {
		bs := st.budgets[st.ruleBudget[rt.boundBy]]
		bounded, stop = context.WithTimeoutCause(ectx, rt.bound, bs.overrun)
	}
	replaced, released := e.replacedSince(st), make(chan struct{})
	go func() {
		select {
		case <-replaced:
			cancel(errRulesChanged)
		case <-released:
		}
	}()
	return bounded, func() {
		close(released)
		stop()
		cancel(nil)
	}
}

// explainOverran answers x, whose EXPLAIN its max_duration cut off (cause, from explainContext;
// err, the EXPLAIN's error), as a statement cancelled by it is answered (overran): counted and
// logged as the bounding budget's block, reason max_duration, and an error matching ErrOverrun
// and, through err, context.DeadlineExceeded.
func (e *Engine) explainOverran(st *compiled, x *Exec, rt *route, cause, err error) error {
	r := rt.boundBy
	e.blockOverrun(x, st.budgets[st.ruleBudget[r]], st.ruleName[r], rt.bound, e.now())
	return fmt.Errorf("%w (in its EXPLAIN, before it was sent): %w", cause, err)
}
