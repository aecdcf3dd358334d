// Package pgxconn is the server clock reader's connection over pgx: a [serverclock.Conn] over a
// *pgx.Conn of its own, so that package serverclock, and the engine it teaches, know no
// database driver.
//
// Its one job is to open that connection ([Connector]: the application's settings, its own
// application_name and statement_timeout) and to put pg_stat_statements' rows in serverclock's
// terms ([Conn.Read]: the counters of the query identifiers asked for, and when the view was
// last reset).
//
// It may import internal/serverclock, pgx and pgerrcode (SQLSTATE names); only the driver (and
// tests) import it.
package pgxconn
