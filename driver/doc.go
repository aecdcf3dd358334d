// Package driver is pgtraffic's database/sql driver: client-side traffic control for PostgreSQL.
//
// It wraps pgx's database/sql driver ([github.com/jackc/pgx/v5/stdlib]). Before a statement is
// sent it is identified (a pg_query fingerprint), tagged (built-in metadata, sqlcommenter comments
// and [github.com/pgtraffic/pgtraffic/tagging] context tags), checked by the query guards, costed
// (planner cost from a cached EXPLAIN times a factor learned per pattern) and checked against the
// budgets its tags select. An over-budget statement is warned about, or refused with a
// [*BlockedError] before it reaches the server.
//
// # Opening a database
//
// With no code beyond the import, the driver registers itself as "pgtraffic" and reads the rules
// file named by the PGTRAFFIC_RULES environment variable ([EnvRules]), if set:
//
//	import _ "github.com/pgtraffic/pgtraffic/driver"
//
//	db, err := sql.Open("pgtraffic", "postgres://app@db/app")
//
// [Open] and [NewConnector] take options instead:
//
//	db, err := driver.Open(dsn, driver.WithRulesFile("/etc/pgtraffic/rules.yaml"))
//
// Closing the *sql.DB stops everything the connector started (the rules-file watcher and the
// health sampler). Every path of database/sql goes through pgtraffic: Exec, Query, QueryRow,
// prepared statements, transactions and *sql.Conn.
//
// # Rules
//
// The rules — budgets, the rules that route statements to them, health throttling and query
// guards — are the types of package [github.com/pgtraffic/pgtraffic/driver/rules], where every
// field is documented. This package aliases them ([Config], [Budget], [Rule], [Guards], [Guard],
// [Mode], [Duration]) and exports the modes ([ModeEnforce], [ModeWarn], [ModeOff]), so that a
// program can build its rules in code:
//
//	cfg := &driver.Config{
//		Budgets: []driver.Budget{{Name: "reporting", Mode: driver.ModeEnforce, MaxConcurrent: 4}},
//		Rules:   []driver.Rule{{Budget: "reporting", Match: map[string]string{"app": "reporting"}}},
//	}
//	db, err := driver.Open(dsn, driver.WithConfig(cfg))
//
// [WithRulesFile] watches the file: a valid change is in force before the next statement, an
// invalid one is logged and counted and the last good rules stay. [Connector.SetConfig] does the
// same from code. A budget keeps its state (debt, statements in flight) across reloads while its
// name stays. Budgets are in warn mode unless they say otherwise, so that new limits can be
// watched before they are enforced.
//
// # Tags
//
// Rules match tags. Every statement carries the built-in tags username, database,
// application_name, fingerprint, statement (select, insert, update, delete, merge, ddl, utility,
// other) and table (one per table it names). Code adds tags to a context with
// [github.com/pgtraffic/pgtraffic/tagging.With]; a sqlcommenter comment in the SQL text adds
// tags too. Neither replaces a built-in tag (one with a built-in key is ignored), since comments
// can be injected and the built-in tags state facts of the statement and connection.
//
// # Blocked statements
//
// A blocked statement returns a [*BlockedError]. Test for it with errors.Is(err, [ErrBlocked]) or
// errors.As. Nothing was sent to the server, so it is safe to retry
// ([BlockedError.SafeToRetry]) once [BlockedError.RetryAfter] has passed; a zero RetryAfter means
// that waiting cannot help. It is never driver.ErrBadConn, so database/sql does not retry it on
// another connection. Batch jobs ask first with [Connector.Check] or [Connector.Wait].
//
// # Telemetry
//
// The connector records OpenTelemetry spans and metrics by the database semantic conventions,
// with the global providers unless [WithTracerProvider] and [WithMeterProvider] name others, and
// logs warn and block decisions through [log/slog] ([WithLogger]). Nothing recorded holds a SQL
// literal or a bound value: query texts are normalised. [Connector.Snapshot] and
// [Connector.Handler] serve the live state.
//
// # pgx-only features
//
// database/sql hides the *pgx.Conn behind pgtraffic's connection; [RawConn] reaches it for CopyFrom,
// LISTEN/NOTIFY and other pgx-only features. Statements sent that way bypass traffic control.
package driver
