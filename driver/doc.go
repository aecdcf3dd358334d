// Package driver is pgtraffic's database/sql driver: client-side traffic control for PostgreSQL.
//
// It wraps pgx's database/sql driver ([github.com/jackc/pgx/v5/stdlib]). Before a statement is
// sent it is identified (a pg_query fingerprint), tagged (built-in metadata, sqlcommenter comments
// and [github.com/pgtraffic/pgtraffic/tagging] context tags), costed (planner cost from a cached
// EXPLAIN times a factor learned per pattern) and checked against the budgets its tags select.
// An over-budget statement is warned about, or blocked with a [*BlockedError] before it reaches the
// server.
//
// # Opening a database
//
// With no code beyond the import, the driver registers itself as "pgtraffic" and reads the rules
// file named by the PGTRAFFIC_RULES environment variable, if set:
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
// health sampler).
//
// # Blocked statements
//
// A blocked statement returns a [*BlockedError]. Test for it with errors.Is(err, [ErrBlocked]) or
// errors.As. It is never driver.ErrBadConn, so database/sql does not retry it on another
// connection, and nothing was sent to the server.
//
// # pgx-only features
//
// database/sql hides the *pgx.Conn behind pgtraffic's connection; [RawConn] reaches it for CopyFrom,
// LISTEN/NOTIFY and other pgx-only features. Statements sent that way bypass traffic control.
package driver
