// Package pgxexplain runs the EXPLAIN that a statement's predicted cost starts from, on the
// statement's own pgx connection, and reads the plan's total cost.
//
// [Explain] runs EXPLAIN of the caller's statement with the caller's arguments on the caller's
// connection, and never changes the caller's session or transaction (a savepoint guards it inside
// a transaction). Every failure is the caller's cue to fall back to history; the caller's
// statement is never failed or altered by it. [On] hands a connection to the engine
// (engine.Conn) without allocating.
//
// It imports pgx, pgerrcode (SQLSTATE names) and internal/cost (for cost.ErrNotSent); only the
// driver and tests import it.
package pgxexplain
