package engine

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"

	"github.com/pgtraffic/pgtraffic/internal/pattern"
)

// logEvery is the least time between two logged decisions of one budget and decision. A budget
// under pressure decides thousands of times a second; the log gets one line a second saying how
// many were suppressed, and the metrics count every one.
const logEvery = time.Second

// maxLimited bounds the (budget, decision) pairs a warnLimiter tracks: budgets are few, but a
// rules file may name a budget per tenant.
const maxLimited = 10_000

// warnLimiter rate-limits decision logs per (budget, decision).
type warnLimiter struct {
	mu sync.Mutex // protects the fields below
	m  map[string]*limitState
}

type limitState struct {
	last       time.Time
	suppressed int
}

func (l *warnLimiter) init() { l.m = map[string]*limitState{} }

// allow reports whether to log now, and how many were suppressed since the last log line.
func (l *warnLimiter) allow(key string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.m[key]
	if s == nil {
		if len(l.m) > maxLimited {
			clear(l.m)
		}
		s = &limitState{}
		l.m[key] = s
	}
	if !s.last.IsZero() && now.Sub(s.last) < logEvery {
		s.suppressed++
		return false, 0
	}
	n := s.suppressed
	s.last, s.suppressed = now, 0
	return true, n
}

// thresholdMessage is the log message of a limit at or past its warning_threshold, in either
// mode: the statement runs.
const thresholdMessage = "pgtraffic: budget limit past its warning_threshold (the statement runs)"

// decisionMessages are the other log messages by {blocked, by a guard}.
var decisionMessages = map[[2]bool]string{
	{false, false}: "pgtraffic: statement over budget (warn mode: it runs)",
	{true, false}:  "pgtraffic: statement blocked",
	{false, true}:  "pgtraffic: query guard matched (warn mode: it runs)",
	{true, true}:   "pgtraffic: statement blocked by query guard",
}

func (e *Engine) noteWarn(budgetName string, d *Denial, p *pattern.Pattern) {
	e.stats.Warned.Add(1)
	if d.Reason != vocab.ReasonWarningThreshold { // a would-be refusal, for the status
		e.blocks.add(e.now(), budgetName, DecisionWarn, d.Reason, p)
	}
	e.logDecision(budgetName, DecisionWarn, d, p)
}

// fingerprintAttr is a log record's attribute naming p, the one way pgtraffic's logs name a
// statement: its fingerprint, never its text (a debug record adds the normalised text).
func fingerprintAttr(p *pattern.Pattern) slog.Attr { return slog.String("fingerprint", p.Fingerprint) }

// logDecision logs a warn or block decision, rate-limited per budget. It never logs SQL text
// beyond the fingerprint: the normalised text is in the telemetry, literals are nowhere.
func (e *Engine) logDecision(budgetName, decision string, d *Denial, p *pattern.Pattern) {
	ok, suppressed := e.warns.allow(budgetName+"\x00"+decision, e.now())
	if !ok {
		return
	}
	msg := decisionMessages[[2]bool{decision == DecisionBlock, d.Reason == vocab.ReasonGuard}]
	if d.Reason == vocab.ReasonWarningThreshold {
		msg = thresholdMessage
	}
	attrs := []slog.Attr{
		slog.String("budget", budgetName),
		slog.String("decision", decision),
		slog.String("reason", d.Reason),
		fingerprintAttr(p),
	}
	if d.Limit != "" {
		attrs = append(attrs, slog.String("limit", d.Limit))
	}
	if d.RetryAfter > 0 {
		attrs = append(attrs, slog.Duration("retry_after", d.RetryAfter))
	}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("suppressed", suppressed))
	}
	e.log.LogAttrs(context.Background(), slog.LevelWarn, msg, attrs...)
}
