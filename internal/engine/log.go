package engine

import (
	"context"
	"log/slog"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"

	"github.com/pgtraffic/pgtraffic/internal/pattern"
)

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

// FingerprintAttr is a log record's attribute naming a statement by its fingerprint fp, the one
// way pgtraffic's logs name a statement: never by its text (a debug record adds the normalised
// text).
func FingerprintAttr(fp string) slog.Attr { return slog.String("fingerprint", fp) }

// fingerprintAttr is FingerprintAttr of p's fingerprint.
func fingerprintAttr(p *pattern.Pattern) slog.Attr { return FingerprintAttr(p.Fingerprint) }

// logDecision logs a warn or block decision, rate-limited per budget. It never logs SQL text
// beyond the fingerprint: the normalised text is in the telemetry, literals are nowhere.
func (e *Engine) logDecision(budgetName, decision string, d *Denial, p *pattern.Pattern) {
	ok, suppressed := e.warns.Allow(budgetName+"\x00"+decision, e.now())
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
