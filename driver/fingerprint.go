package driver

import "github.com/pgtraffic/pgtraffic/internal/pattern"

// Fingerprint returns the fingerprint pgtraffic gives a statement of text sql: what a rule's
// match: {fingerprint: ...} selects, and what the status page, the pgtraffic.fingerprint span
// attribute and the log show. Texts that differ only in their literals, parameters, comments or
// whitespace share it, so the text of a runaway query as pg_stat_activity or pg_stat_statements
// shows it (literals or $n) gives the fingerprint to block it by, even when no rule selects it
// yet and the status page does not list it (the incident runbook in driver/rules).
//
// The text must be whole: pg_stat_activity cuts a statement's text at track_activity_query_size
// (1 KiB by default), and the fingerprint of the cut text is another, which no statement
// carries; take a long statement's text from pg_stat_statements, or check the fingerprint
// against the status page's. A pgx CopyFrom is decided as the COPY text pgx sends, which
// pg_stat_activity shows: its fingerprint is that text's; or select every copy into a table
// by match: {statement: copy, table: <name>}.
func Fingerprint(sql string) string { return pattern.Analyze(sql).Fingerprint }
