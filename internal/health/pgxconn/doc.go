// Package pgxconn opens the health sampler's dedicated connection with pgx: a [health.Conn]
// over a *pgx.Conn, so that package health, and the engine above it, know no database driver.
//
// Its one job is to put pgx's results and errors in health's terms. [Conn.ReadNumber] decodes
// the single numeric column a health query returns (int2, int4, int8, float4, float8 or
// numeric) and reports any other shape as a [health.ResultError]; errors keep *pgconn.PgError
// (whose SQLState method names the condition) and mark pgconn's timeouts with
// [health.ErrTimeout], so that the sampler describes a failure without the server's message
// text. [SystemID] reads the secret the sampler election signs samples with.
//
// It may import internal/health and pgx; only the driver (and tests) import it.
package pgxconn
