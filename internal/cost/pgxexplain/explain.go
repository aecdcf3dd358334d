package pgxexplain

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtraffic/pgtraffic/internal/cost"
)

// Errors returned by [Explain]. Every error that wraps [cost.ErrNotSent] means nothing reached
// the server; any other error means an EXPLAIN was sent and failed, and the caller's session and
// transaction were restored (unless the error wraps ErrNotRestored).
var (
	ErrTxAborted  = fmt.Errorf("%w: the transaction is aborted", cost.ErrNotSent)
	ErrConnBusy   = fmt.Errorf("%w: the connection is busy", cost.ErrNotSent)
	ErrConnClosed = fmt.Errorf("%w: the connection is closed", cost.ErrNotSent)

	// ErrNotRestored means the EXPLAIN failed inside the caller's transaction and rolling back to
	// the savepoint failed too (the server or the network failed): the transaction may be left
	// aborted. The caller's next statement then fails as the server sees fit.
	ErrNotRestored = errors.New("pgxexplain: explain failed and its savepoint could not be rolled back")
)

const (
	// VERBOSE makes the output carry the query identifier that pg_stat_statements keys the
	// statement's counters by (when the server computes one).
	explainPrefix = "EXPLAIN (VERBOSE, FORMAT JSON) "
	// savepointName is fixed: a caller's savepoint of the same name is shadowed only between our
	// SAVEPOINT and RELEASE, because ROLLBACK TO and RELEASE act on the most recent one.
	savepointName = "pgtraffic_explain"
	// rollbackTimeout bounds the ROLLBACK TO after a failed EXPLAIN. The rollback ignores the
	// caller's cancellation: a cancelled EXPLAIN must still not leave the transaction aborted.
	rollbackTimeout = 5 * time.Second
)

// Explain runs EXPLAIN (VERBOSE, FORMAT JSON) query with args on conn, the connection the caller's
// statement will run on, and returns the plan's total cost in planner units and the statement's
// query identifier (0 when the server computes none). EXPLAIN without
// ANALYZE plans the statement and never executes it, so INSERT, UPDATE, DELETE, MERGE,
// INSERT ... RETURNING and data-modifying CTEs are safe to explain.
//
// The caller must only pass statements that EXPLAIN accepts (the pattern's Explainable flag):
// Explain does not inspect the text. It always uses the extended protocol, whose Parse rejects a
// string holding several statements, so such a string fails instead of running.
//
// conn is the *pgx.Conn the caller's statement will run on (under database/sql,
// (*stdlib.Conn).Conn()); Explain uses it only during the call, and the caller must not use it
// concurrently. query must be the SQL text, not a prepared statement's name. args are the caller's
// arguments as pgx's Query takes them; they are sent positionally, encoded as pgx's
// QueryExecModeExec encodes them (unspecified types), so the server infers their types exactly as
// it does for the caller's own statement. Leading pgx option arguments are honoured as pgx would
// honour them: QueryExecMode and result-format options are dropped, a QueryRewriter such as
// pgx.NamedArgs rewrites the query first. Explain neither modifies args nor keeps a reference.
//
// Safety of the caller's session:
//   - Nothing is sent when ctx is already done, the connection is closed or busy (cost.ErrNotSent).
//   - Outside a transaction the EXPLAIN runs in its own implicit transaction.
//   - In a transaction it is wrapped in SAVEPOINT pgtraffic_explain ... ROLLBACK TO ... RELEASE,
//     pipelined in one round trip, so that the locks the EXPLAIN took are released: a statement
//     refused after its EXPLAIN leaves its transaction holding nothing it did not hold before.
//     If the EXPLAIN fails, the server skips the rest, and ROLLBACK TO and RELEASE follow, so the
//     error cannot abort the caller's transaction. What a savepoint cannot undo stays: a
//     REPEATABLE READ or SERIALIZABLE transaction whose first statement this is takes its
//     snapshot now.
//   - In an aborted transaction nothing is sent (ErrTxAborted).
//   - Prepared statements, pgx's statement cache and session settings are untouched: the
//     EXPLAIN uses the unnamed statement, which the caller's next statement replaces.
//   - If ctx ends while the EXPLAIN is in flight, pgx interrupts it as it would the caller's
//     statement; with pgx's default context handling that closes the connection. Do not give
//     Explain a shorter deadline than the statement it precedes.
//
// Error texts never contain the query, its arguments or the server's message, which may quote
// them; server errors carry only the SQLSTATE, but for the server's cancellation of the
// EXPLAIN (cost.ErrCancelled), whose message quotes neither.
func Explain(ctx context.Context, c *pgx.Conn, query string, args []any) (cost.Plan, error) {
	if err := ctx.Err(); err != nil {
		return cost.Plan{}, fmt.Errorf("%w: %w", cost.ErrNotSent, err)
	}
	if c == nil {
		return cost.Plan{}, ErrConnClosed
	}
	pc := c.PgConn()
	if pc.IsClosed() {
		return cost.Plan{}, ErrConnClosed
	}
	if pc.IsBusy() {
		return cost.Plan{}, ErrConnBusy
	}
	status := pc.TxStatus()
	if status == 'E' {
		return cost.Plan{}, ErrTxAborted
	}
	if status != 'I' && status != 'T' {
		return cost.Plan{}, fmt.Errorf("%w: unknown transaction status %q", cost.ErrNotSent, status)
	}

	query, values, simple, err := explainArgs(ctx, c, query, args)
	if err != nil {
		return cost.Plan{}, err
	}
	// Encoding before sending anything means an unencodable argument costs no round trip and
	// leaves no savepoint behind.
	var eqb pgx.ExtendedQueryBuilder
	if err := eqb.Build(c.TypeMap(), nil, values); err != nil {
		return cost.Plan{}, cost.ErrUnencodable
	}
	sql := explainPrefix + query

	var plan cost.Plan
	if status == 'I' {
		res := pc.ExecParams(ctx, sql, eqb.ParamValues, nil, eqb.ParamFormats, nil).Read()
		if res.Err != nil {
			return cost.Plan{}, sentError(pc, res.Err)
		}
		plan, err = resultCost(res)
	} else {
		plan, err = explainInTx(ctx, pc, sql, &eqb)
	}
	if simple {
		// The statement runs with its arguments written into its text (pgx's simple protocol),
		// and the server gives a constant a query identifier apart from a parameter's: the
		// EXPLAIN's, with parameters, is not the one the statement's counters are kept under.
		plan.QueryID = 0
	}
	return plan, err
}

// explainInTx pipelines SAVEPOINT, EXPLAIN, ROLLBACK TO and RELEASE with a single Sync: one round
// trip when the EXPLAIN succeeds. When it fails the server skips the rest and the transaction is
// aborted until the ROLLBACK TO that follows.
func explainInTx(ctx context.Context, pc *pgconn.PgConn, sql string, eqb *pgx.ExtendedQueryBuilder) (cost.Plan, error) {
	batch := &pgconn.Batch{}
	batch.ExecParams("SAVEPOINT "+savepointName, nil, nil, nil, nil)
	batch.ExecParams(sql, eqb.ParamValues, nil, eqb.ParamFormats, nil)
	batch.ExecParams("ROLLBACK TO SAVEPOINT "+savepointName, nil, nil, nil, nil)
	batch.ExecParams("RELEASE SAVEPOINT "+savepointName, nil, nil, nil, nil)
	results, batchErr := pc.ExecBatch(ctx, batch).ReadAll()

	if pc.IsClosed() {
		return cost.Plan{}, sentError(pc, batchErr)
	}
	if pc.TxStatus() == 'E' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		_, rbErr := pc.Exec(rctx, "ROLLBACK TO SAVEPOINT "+savepointName+"; RELEASE SAVEPOINT "+savepointName).ReadAll()
		if rbErr != nil || pc.TxStatus() != 'T' {
			return cost.Plan{}, fmt.Errorf("%w (%w)", ErrNotRestored, sentError(pc, batchErr))
		}
		return cost.Plan{}, sentError(pc, batchErr)
	}
	if batchErr != nil {
		return cost.Plan{}, sentError(pc, batchErr)
	}
	if len(results) != 4 {
		return cost.Plan{}, errMalformedPlan
	}
	return resultCost(results[1])
}

// resultCost extracts the total cost and query identifier from EXPLAIN's single row and column.
func resultCost(res *pgconn.Result) (cost.Plan, error) {
	if len(res.Rows) != 1 || len(res.Rows[0]) != 1 {
		return cost.Plan{}, errMalformedPlan
	}
	return parsePlan(res.Rows[0][0])
}

// sentError describes a failure after sending. A server error is reduced to its SQLSTATE: its
// message may quote literals or argument values. The server's cancellation of the EXPLAIN
// (lock_not_available: a lock_timeout; query_canceled: a statement_timeout or a cancel
// request) is kept whole, wrapped in cost.ErrCancelled: its message quotes nothing of the
// statement, and the engine answers the statement with it, as it is the server's ending of the
// session (sessionEnded). A failure that closed pc (the server ended the session) is marked
// with cost.ErrConnLost (cost.ConnLost). The end of the caller's context is pgx's error for
// it, whole, as the statement would have had it (pgconn.Timeout recognises it): the engine
// answers the statement with it.
func sentError(pc *pgconn.PgConn, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	err = serverError(err)
	if pc.IsClosed() {
		return cost.ConnLost(err)
	}
	return err
}

// serverError is sentError's description of err.
func serverError(err error) error {
	if err == nil {
		return errors.New("pgxexplain: explain failed")
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if pgErr.Code == pgerrcode.LockNotAvailable || pgErr.Code == pgerrcode.QueryCanceled {
			return fmt.Errorf("%w: %w", cost.ErrCancelled, pgErr)
		}
		if sessionEnded(pgErr) {
			return pgErr
		}
		return fmt.Errorf("cost: explain failed: SQLSTATE %s", pgErr.Code)
	}
	return fmt.Errorf("cost: explain failed: %w", err)
}

// sessionEnded reports whether e is the server ending the session (FATAL or PANIC: an
// administrator's pg_terminate_backend, an idle-in-transaction timeout, a shutdown). Its message
// is the session's, quoting nothing of the statement: kept whole, the statement, which cannot
// run on that connection either, is answered with it (cost.ErrConnLost), as without pgtraffic.
func sessionEnded(e *pgconn.PgError) bool {
	severity := cmp.Or(e.SeverityUnlocalized, e.Severity)
	return severity == "FATAL" || severity == "PANIC"
}

// explainArgs turns the caller's arguments into the values pgx would send, applying the leading
// pgx options the caller's own statement would apply, and reports whether the statement runs
// under pgx's simple protocol (a leading QueryExecMode, else the connection's default).
func explainArgs(ctx context.Context, c *pgx.Conn, query string, args []any) (_ string, _ []any, simple bool, _ error) {
	values := args // only resliced: the caller's slice is not modified
	var mode *pgx.QueryExecMode
	var rewriter pgx.QueryRewriter
options:
	for len(values) > 0 {
		switch v := values[0].(type) {
		case pgx.QueryExecMode:
			mode = &v
			values = values[1:]
		case pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			values = values[1:]
		case pgx.QueryRewriter:
			rewriter = v
			values = values[1:]
		default:
			break options
		}
	}
	if mode == nil { // the connection's default; Config copies the whole config, so only then
		m := c.Config().DefaultQueryExecMode
		mode = &m
	}
	simple = *mode == pgx.QueryExecModeSimpleProtocol
	if rewriter == nil {
		return query, values, simple, nil
	}
	q, v, err := rewriter.RewriteQuery(ctx, c, query, values)
	if err != nil {
		return "", nil, false, fmt.Errorf("%w: rewriting the query failed", cost.ErrNotSent)
	}
	return q, v, simple, nil
}

// Conn is a pgx connection as the engine takes it (engine.Conn): the connection a statement
// will run on, which it EXPLAINs the statement on. It holds only the pointer, so that making
// one allocates nothing.
type Conn struct{ c *pgx.Conn }

// On is the Conn of c, the connection a statement will run on.
func On(c *pgx.Conn) Conn { return Conn{c} }

// Explain runs [Explain] on the connection.
func (c Conn) Explain(ctx context.Context, query string, args []any) (cost.Plan, error) {
	return Explain(ctx, c.c, query, args)
}

// InTransaction reports whether the connection is inside a transaction block (a failed one
// included): its session may hold locks until the transaction ends.
func (c Conn) InTransaction() bool { return c.c.PgConn().TxStatus() != 'I' }
