// Package tagging attaches key/value tags to database work, so that pgtraffic
// can match queries against the rules and budgets of a rules file.
//
// It imports only internal/bounded and the standard library: it knows nothing of the driver, the
// rules or the engine.
//
// A tag is a pair of strings such as app=reporting or tenant=42. Tags reach
// the pgtraffic driver in two ways: on the [context.Context] passed to
// QueryContext, ExecContext and friends, and as a [sqlcommenter] comment at the
// end of the SQL text. The driver merges both with its built-in metadata
// (username, database, application_name, fingerprint, statement, table, and
// query_name from a leading sqlc comment such as "-- name: ListOrders :many").
// Context tags win over comment tags. Neither replaces a built-in tag, which
// states a fact of the statement or the connection: a comment or context tag
// with a built-in key is ignored. Comments can be injected, and one could
// otherwise claim another table to escape a budget or a scoped guard.
//
// # Tagging a context
//
// [With] returns a context that carries tags, merged onto any tags the parent
// context already carries (the newer value of a key wins). [From] reads them
// back as an immutable [Tags] value:
//
//	ctx = tagging.With(ctx, "app", "billing", "controller", "invoices")
//	rows, err := db.QueryContext(ctx, "SELECT ...") // matched by rules on app and controller
//
// Keys are case-sensitive. A pair with an empty key is dropped; empty values
// are kept. [New] builds [Tags] without a context, and [Tags.Merge] lays one
// set over another.
//
// # Tags in SQL comments
//
// [Append] writes tags into a statement as a sqlcommenter comment and [Parse]
// reads them back, for tags that must travel with the SQL text itself (for
// example through a proxy, or into pg_stat_activity):
//
//	sql := tagging.Append("SELECT * FROM orders;", tagging.New("app", "billing"))
//	// SELECT * FROM orders /*app='billing'*/;
//
// A comment is untrusted input: Parse reads at most 32 pairs, and skips a pair
// whose key is longer than 64 bytes or whose value is longer than 256.
//
// # HTTP requests
//
// [Middleware] tags each request's context with route, method and
// remote_address (the client's IP address). Register it inside a
// [net/http.ServeMux] so that the route tag is the path of the mux pattern
// (low cardinality) rather than the raw URL path:
//
//	mux.Handle("GET /orders/{id}", tagging.Middleware(ordersHandler))
//
// Handlers then pass r.Context() to database/sql, and rules such as
// match: {route: "/orders/{id}"} or match: {remote_address: 203.0.113.0/24}
// apply to the queries they run. Quote a route with braces: inside a YAML
// {...} mapping, an unquoted brace ends it.
//
// # Concurrency and cost
//
// [Tags] values are immutable and safe for concurrent use. The driver calls
// [From] and iterates [Tags.All] for every statement, so both are free of
// allocations; [Parse] allocates only when the statement carries a comment.
//
// [sqlcommenter]: https://google.github.io/sqlcommenter/spec/
package tagging
