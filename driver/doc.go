// Package driver is pgtraffic's client-side traffic control for PostgreSQL, with two front ends:
// a database/sql driver ([Open], [NewConnector]) and a pgx-native pool ([NewPool]).
//
// It may import the layers below it (the engine, internal/engine, and its runtime,
// internal/runtime; the rules config in driver/rules and driver/rules/vocab, tagging,
// internal/pattern, internal/health, internal/bounded, internal/cost (an EXPLAIN's lost
// connection), internal/loglimit, and the pgx adapters
// internal/health/pgxconn, internal/cost/pgxexplain and internal/serverclock/pgxconn) and the
// libraries of its two front ends: pgx with pgconn, pgtype, pgxpool and stdlib (no other package
// imports stdlib or database/sql/driver), puddle (pgxpool's closed-pool error) and pgerrcode
// (SQLSTATE names), go-redis for [WithRedisClient], and OpenTelemetry.
//
// The first wraps pgx's database/sql driver ([github.com/jackc/pgx/v5/stdlib]), the second a
// [github.com/jackc/pgx/v5/pgxpool.Pool]; both decide alike. Before a statement is
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
// [NewConnectorFromConfig] takes a *pgx.ConnConfig from pgx.ParseConfig adjusted in code (a TLS
// config, a dialer, a tracer), as pgx's stdlib.OpenDB does; pass the connector to sql.OpenDB.
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
//		Budgets: []driver.Budget{{Name: "reporting", Mode: driver.ModeEnforce, MaxConcurrent: new(4)}},
//		Rules:   []driver.Rule{{Budget: "reporting", Match: map[string]string{"app": "reporting"}}},
//	}
//	db, err := driver.Open(dsn, driver.WithConfig(cfg))
//
// [WithRulesFile] watches the file's directory (and, for a symlink to a file in another
// directory, that directory too): a valid change is in force within a second, an
// invalid one is logged and counted and the last good rules stay. Only a complete file is
// applied: one left unchanged for 0.6s and read the same twice, so write the file elsewhere and
// rename it into place. If the directory is removed and re-created, the watch is re-armed and
// the file reloaded. [Connector.SetConfig] does the same from code. A budget keeps its state
// (debt, statements in flight) across reloads while its name stays. Budgets are in warn mode
// unless they say otherwise, so that new limits can be watched before they are enforced.
//
// # Tags
//
// Rules match tags. Every statement carries the built-in tags username, database,
// application_name, fingerprint, statement (select, insert, update, delete, merge, copy, ddl,
// utility, other) and table (one per table it names), and a statement whose text begins with
// sqlc's "-- name: ListOrders :many" comment carries query_name=ListOrders, so that a rule can
// select one generated query by name. Code adds tags to a context with
// [github.com/pgtraffic/pgtraffic/tagging.With]; a sqlcommenter comment in the SQL text adds
// tags too. Neither replaces a built-in tag (one with a built-in key is ignored), since comments
// can be injected and the built-in tags state facts of the statement and connection.
//
// # How a statement is decided
//
// A statement's text is identified once and cached by content (texts up to 2 KiB, as many as
// [WithPatternCacheSize] allows), together with the budgets it was routed to under the rules
// and context tags in force, so that a repeated text skips the tag merge and the rule match.
// Its cost is predicted afresh for every execution. It is admitted only if every enforce budget
// it selects admits it: first the budget's health thresholds, zero limits and quarantine, then,
// with no statement ahead of it waiting for the same budget and value, its per_query_limit,
// slots and bucket room. All or nothing.
//
// # Shared budgets
//
// By default each process enforces its budgets alone. When the rules have a coordination
// section (see [github.com/pgtraffic/pgtraffic/driver/rules.Coordination]), every budget that
// does not say shared: false holds across all the instances of the application: each instance
// enforces a lease (a drain rate, a bucket and slots) that it renews through Redis once per
// sync_interval, so no statement waits on the network. If Redis is unreachable, the database
// keeps working: instances fall back to an even split of each budget. [WithRedisClient] gives
// the connector a client of its own (Sentinel, Cluster) instead of the section's URL.
//
// # Blocked statements
//
// A blocked statement returns a [*BlockedError]. Test for it with errors.Is(err, [ErrBlocked]) or
// errors.As. Nothing was sent to the server, so it is safe to retry
// ([BlockedError.SafeToRetry]) once [BlockedError.RetryAfter] has passed; a zero RetryAfter means
// that waiting cannot help: a guard or a zero limit (max_concurrent: 0, server_share: 0) refused
// it, or its predicted cost exceeds per_query_limit or the budget's whole bucket (reason
// per_query_limit, limit "burst_limit=10s (a predicted 12s never fits)"). Such a pattern runs one statement as a probe every 10 s, cancelled past the
// limit, so that a prediction that is too high corrects itself (see the README). It is never
// driver.ErrBadConn, so database/sql does not retry it on another connection. Batch jobs ask
// first with [Connector.Check] or [Connector.Wait].
//
// # Rows
//
// A query's budget slot is held until its rows are closed or exhausted: close every *sql.Rows.
// Rows dropped without Close have their slot released when the garbage collector finds them
// (counted in pgtraffic.rows.leaked and logged), but database/sql keeps their connection in use
// for good, and rows of a prepared *sql.Stmt are never found.
//
// From Go 1.27, database/sql lets the driver scan each column (driver.RowsColumnScanner), and
// pgtraffic hands that to pgx: *[]string, pgtype.Array, pgtype.Range and the other destinations
// pgx scans work as they do under pgx's own driver. With Go 1.26, wrap them in
// pgtype.Map.SQLScanner, as with pgx's stdlib.
//
// # Telemetry
//
// The connector records OpenTelemetry spans and metrics by the database semantic conventions,
// with the global providers unless [WithTracerProvider] and [WithMeterProvider] name others
// (asked once a second what to record: one installed later records the statements from then
// on), and logs warn and block decisions through [log/slog] ([WithLogger]). Nothing recorded
// holds a SQL literal or a bound value: query texts are normalised, and cut to 4 KiB (a longer one, such as
// a bulk INSERT's, ends with "… (N bytes cut)"). Every attribute is valid UTF-8 (invalid
// bytes replaced by U+FFFD), and each tag's key is cut to 64 bytes and its values to 256, since
// tags may come from comments or request paths. The metrics are pgtraffic.decisions,
// pgtraffic.budget.*, the caches', EXPLAIN's, reloads' and health sampling's counters,
// pgtraffic.rows.leaked and, for shared budgets, pgtraffic.coordination.* (the README lists
// them all with units and attributes). [Connector.Snapshot] and [Connector.Handler] serve the
// live state, shared budgets' leases included.
//
// # pgx and sqlc
//
// [NewPool] (or [NewPoolFromConfig], for a *pgxpool.Config adjusted in code) takes the same
// options as [Open] and returns a [*Pool]: pgxpool's Exec, Query, QueryRow, SendBatch, CopyFrom
// and Begin, each statement decided as under database/sql (EXPLAIN on the connection it will
// run on), and the connector's Check, Wait, Snapshot, Handler and SetConfig. It satisfies
// sqlc's pgx/v5 DBTX, and the pgx.Tx of its Begin is controlled too, so sqlc's WithTx works:
//
//	pool, err := driver.NewPool(ctx, dsn, driver.WithRulesFile("rules.yaml"))
//	...
//	defer pool.Close()
//	q := db.New(pool) // a sqlc-generated package
//	orders, err := q.ListOrders(ctx, customer) // a *BlockedError when refused
//
// A batch (SendBatch) is decided whole before anything is sent: its statements are each
// identified, guarded and costed, and the batch is admitted all or nothing against the union
// of their budgets at the sum of their costs; a refused batch sends nothing and every result
// returns the [*BlockedError]; an admitted batch holds its slots until its results are closed.
// CopyFrom is the COPY statement pgx sends for it (copy <table> ( <columns> ) from stdin
// binary), tagged statement=copy and table=<name>, its cost learned per table and columns; it
// has no query_name (sqlc's :copyfrom passes no text to carry one), so a rule selects it by
// statement and table. Close rows and batch results: their budget slots (and pgxpool's
// connection) are held until then. [Pool.Acquire], [Pool.AcquireFunc] and [Pool.AcquireAllIdle]
// hand out controlled connections; [Pool.Config] and [Pool.Reset] are pgxpool's. [Pool.Raw],
// and the Conn of a transaction or of a [PoolConn], reach pgx underneath; statements sent
// through them bypass traffic control.
//
// # pgx-only features under database/sql
//
// database/sql hides the *pgx.Conn behind pgtraffic's connection; [RawConn] reaches it for CopyFrom,
// LISTEN/NOTIFY and other pgx-only features. Statements sent that way bypass traffic control.
// Code that already uses (*sql.Conn).Raw keeps working if it asserts the Conn method rather than
// pgx's type, which pgtraffic's connection is not:
//
//	err := conn.Raw(func(dc any) error {
//		pc := dc.(interface{ Conn() *pgx.Conn }).Conn() // dc.(*stdlib.Conn) would panic
//		...
//	})
package driver
