package driver

import "github.com/pgtraffic/pgtraffic/internal/pattern"

// Fingerprint returns the fingerprint pgtraffic gives a statement of text sql: what a rule's
// match: {fingerprint: ...} selects, and what the status page, the pgtraffic.fingerprint span
// attribute and the log show. Texts that differ only in their literals, parameters, comments or
// whitespace share it, so the text of a runaway query as pg_stat_activity or pg_stat_statements
// shows it (literals or $n) gives the fingerprint to block it by, even when no rule selects it
// yet and the status page does not list it (the incident runbook in driver/rules).
func Fingerprint(sql string) string { return pattern.Analyze(sql).Fingerprint }
