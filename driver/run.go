package driver

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/internal/engine"
)

// The statement path both front ends share. Every statement, of the database/sql driver (an
// Exec or a Query of a connection or of a prepared statement) or of the pgx-native pool (Exec,
// Query, QueryRow, CopyFrom and SendBatch, on the pool, a PoolConn or a transaction), runs
// through interceptor.run as a job: begun in the engine, sent, finished. Between its begin and
// its finish it is an openStmt, which its rows (or a batch's results) carry when they finish it
// later.

// job is what run begins, sends and finishes: one statement (*ticket) or a pgx batch
// (*batchJob, decided whole: engine.Batch). Like a statement, it is used by one goroutine at a
// time.
type job interface {
	// begin decides the job in the engine e at at: on conn, the connection its caller holds
	// (onHeld) or one taken from the pool for it alone (onTaken), or before a connection of the
	// pool (beforeConn, conn nil). It returns the context the job runs under, carrying its span.
	begin(ctx context.Context, e *engine.Engine, at place, conn *pgx.Conn) (context.Context, error)
	// Acquired tells the job, admitted before it had a connection (beforeConn), that it has
	// one now, which may refuse it still or hold it back there (acquireAdmitted).
	Acquired(ctx context.Context) error
	// Held is how long the engine held the job back on its connection (an EXPLAIN, a wait for
	// capacity): checkConn checks a connection held idle so.
	Held() time.Duration
	// Abandon ends a decided job unsent, at no cost.
	Abandon(ctx context.Context, err error)
	// EndUndecided ends a job that needed a connection for its EXPLAIN (engine.ErrNeedConn)
	// and could not take one: unsent, undecided.
	EndUndecided(ctx context.Context, err error)
	// Deadline is when the admitted job's max_duration ends and the cause that names it
	// (engine.Exec.Deadline); ok false without one.
	Deadline() (deadline time.Time, cause error, ok bool)
	// finish finishes the begun job with its outcome, then gives it back for reuse (done).
	finish(ctx context.Context, err error)
	// fingerprint is the begun job's (its first statement's) fingerprint, for a log line; ""
	// when nothing read its statement (no rules in force, telemetry idle).
	fingerprint() string
	// done gives the job back for reuse, with nothing of its statement kept: finished, or
	// refused (the engine ended it).
	done()
}

// place is where a job is decided, as the engine's Begin, BeginBeforeConn and BeginTaken (and
// their batch forms) name it.
type place int

const (
	onHeld     place = iota // on the connection its caller holds
	beforeConn              // before it takes a connection from the pool
	onTaken                 // on a connection the pool lent it alone
)

// ticket is one statement's job: its engine ticket, and the text and arguments it is decided
// by. It is reused from one statement to the next, so that deciding a statement allocates
// nothing. A database/sql connection keeps its own (one for its Execs, one per rows wrapper);
// the pool keeps its tickets in a sync.Pool (it has no state of its own per connection to keep
// one in), with the row slabs of their QueryRows.
type ticket struct {
	// Exec is the statement's engine ticket, whose Acquired, Held, Abandon and Deadline are the
	// job's; its Finish is called by the job's finish.
	engine.Exec
	text string // what the statement is decided as (statement)
	args []any
	// rows is the rest of a slab of QueryRow rows (ticket.row): each row is handed out once,
	// never reused. pgxpool hands out its rows from slabs kept per connection, so that a
	// QueryRow allocates nothing; pgxpool keeps nothing of ours per connection, so the slabs
	// are kept in the tickets.
	rows []pgxRow
	home *sync.Pool // where the ticket goes back once its statement is finished; nil: kept by its owner
}

// statement readies t for a statement of text with args, its named arguments made positional
// (named), and returns it.
func (t *ticket) statement(ctx context.Context, text string, args []any) *ticket {
	t.text, t.args = named(ctx, text, args)
	return t
}

func (t *ticket) begin(ctx context.Context, e *engine.Engine, at place, conn *pgx.Conn) (context.Context, error) {
	switch at {
	case beforeConn:
		return e.BeginBeforeConn(ctx, &t.Exec, t.text, t.args)
	case onTaken:
		return e.BeginTaken(ctx, &t.Exec, explainOn(conn), t.text, t.args)
	}
	return e.Begin(ctx, &t.Exec, explainOn(conn), t.text, t.args)
}

func (t *ticket) finish(ctx context.Context, err error) { t.Finish(ctx, err); t.done() }

func (t *ticket) fingerprint() string { return fingerprintOf(&t.Exec) }

// fingerprintOf is x's statement's fingerprint, "" when nothing read it.
func fingerprintOf(x *engine.Exec) string {
	if x.Pattern == nil {
		return ""
	}
	return x.Pattern.Fingerprint
}

// done forgets the statement's arguments (a kept ticket must not keep the caller's values) and
// gives a pooled ticket back to its pool.
func (t *ticket) done() {
	t.text, t.args = "", nil
	if t.home != nil {
		t.home.Put(t)
	}
}

// openStmt is one job in flight, from its begin to its finish: what finishing it needs, and all
// that the leak cleanup of rows never closed needs (leak.go), so it must not point to the rows
// that carry it. Like a statement, it is used by one goroutine at a time.
type openStmt struct {
	j job // the job, set by the caller of run; nil once finished
	// ctx is the job's context as its begin returned it, carrying its span, for its finish
	// (engine.Observer) and the sqlcommenter; nil while no job is in flight.
	ctx context.Context
	// qctx is what the job runs under, its rows included: the caller's context, bounded by its
	// max_duration (overrunContext); cancel releases it (nil without a bound).
	qctx    context.Context
	cancel  context.CancelFunc
	release releaser // gives back the pool's connection it took; nil when it took none
	leaks   *leaks   // where leaked rows are reported; nil for a statement without a cleanup
}

// inFlight reports whether o's job has begun and is not finished.
func (o *openStmt) inFlight() bool { return o.ctx != nil }

// finish finishes the job with its outcome err, the first time only: the engine gives back what
// it held, and its pool connection, its timer and the job go back too. Once finished o keeps
// nothing of the job's: a QueryRow's row stays in its slab a while, and must not keep its
// caller's context.
func (o *openStmt) finish(err error) {
	ctx := o.ctx
	if ctx == nil {
		return
	}
	j, cancel, release := o.j, o.cancel, o.release
	*o = openStmt{leaks: o.leaks}
	// Deferred, so that they are given back even if the observer panics in Finish.
	if release != nil {
		defer release.Release()
	}
	if cancel != nil {
		defer cancel()
	}
	j.finish(ctx, err)
}

// errPanicked is the outcome a statement is finished with when the call that ran it panicked: not
// a success, so the cost model does not learn from it.
var errPanicked = errors.New("pgtraffic: the statement's call panicked")

// blocked converts the engine's denial into the public error. Never driver.ErrBadConn: a
// blocked statement must not be retried on another connection.
func blocked(err error) error {
	var d *engine.Denial
	if errors.As(err, &d) {
		return &BlockedError{Budget: d.Budget, Rule: d.Rule, Reason: d.Reason, Fingerprint: d.Fingerprint,
			RetryAfter: d.RetryAfter, Limit: d.Limit}
	}
	return err
}

// dest is where a statement runs: on a connection its caller holds (a database/sql
// connection's, a [PoolConn]'s, a transaction's: conn, and q when it is sent through something
// else, a pgx.Tx), or on one it takes from the pool once it is admitted (pool), which it gives
// back when it is finished.
type dest struct {
	pool connPool  // nil when the connection is held
	q    querier   // where a held connection's statement is sent; nil: conn
	conn *pgx.Conn // the held connection, for EXPLAIN; nil in unit tests (no EXPLAIN)
	// prepared maps the names of the statements prepared in a transaction to their texts (see
	// pgxTx.Prepare); nil outside one.
	prepared map[string]string
	// names are those of the statements prepared on the pool's connections (preparedNames);
	// nil for a database/sql connection's statement.
	names *preparedNames
	// retry: conn is database/sql's, which retries a statement answered driver.ErrBadConn on
	// another connection (badConn). A [PoolConn]'s or a pgx transaction's is its caller's, and
	// so is its error, as with pgx.
	retry bool
}

// held is where a statement on d's held connection is sent.
func (d *dest) held() querier {
	if d.q != nil {
		return d.q
	}
	return d.conn
}

// text is the text sql is decided as: the statement's text when sql names one prepared in the
// transaction, or on the pool's connections, else sql itself.
func (d *dest) text(sql string) string {
	if len(d.prepared) > 0 {
		if text, ok := d.prepared[sql]; ok {
			return text
		}
	}
	return d.names.text(sql)
}

// run runs o's job (which the caller sets): it begins it at d, sends it with send (to q, under
// qctx: the caller's context, bounded by the job's max_duration), and finishes it with send's
// outcome; unless rows carry it on (rows, and send succeeded: a query's rows, a batch's
// results), which finish it when they end. A panic in send finishes it with errPanicked. It
// returns the refusal (a [*BlockedError]: nothing was sent, the job is back) or send's error,
// made to match ErrOverrun when the job's max_duration ended it.
//
// The engine decides the job on d's held connection, or, for a job of the pool, before it takes
// a connection whenever the decision needs no EXPLAIN: so a refused statement never waits for a
// connection, and one waiting for capacity (max_wait) holds none; once admitted it keeps its
// slots while it waits for the pool (acquireAdmitted), pending slots that a statement on a held
// connection may overtake, and if one did, it is decided again once it has its connection,
// which it gives back if refused then. A job whose cost needs an EXPLAIN on its connection
// takes the connection first (acquireExplained), once its budgets have room for a cost not yet
// known (engine.ErrNeedConn). A job held back by health on a connection it took (after its
// EXPLAIN, or overtaken while it waited for the pool) gives it back and is decided again before
// it, where it waits holding none (engine.ErrWaitBeforeConn); so does one whose connection,
// taken for its EXPLAIN or decided again on, closed while the engine held it back there
// (decideOn, errConnClosed). A statement of database/sql's whose connection closed while the
// engine held it back there is answered driver.ErrBadConn unsent, and database/sql retries it
// on another (badConn).
func (i *interceptor) run(ctx context.Context, o *openStmt, d *dest, rows bool,
	send func(q querier, qctx context.Context) error) (err error) {
	j := o.j
	var q querier
	var sctx context.Context // the context the job's begin returns, for its finish
	if d.pool == nil {
		q = d.held()
		sctx, err = j.begin(ctx, i.engine, onHeld, d.conn)
		if held := j.Held(); err == nil && held > 0 && d.retry {
			err = badConn(sctx, j, d.conn, held)
		}
		if err != nil && d.retry && errors.Is(err, cost.ErrConnLost) {
			// Its connection closed under its EXPLAIN, which answers it with the connection's
			// error: database/sql retries it on another, unsent here, and in a transaction,
			// which it does not retry, the caller has the server's error with it.
			err = fmt.Errorf("%w: %w", driver.ErrBadConn, err)
		}
	} else {
		sctx, q, o.release, err = decideForPool(ctx, d.pool, i.engine, j)
	}
	if err != nil {
		j.done()
		o.j = nil
		return blocked(err)
	}
	o.ctx = sctx
	// It runs under the caller's context, as without pgtraffic (a tracer of pgx's sees the
	// caller's span as its parent), bounded by max_duration: cancelled on the server past it.
	o.qctx, o.cancel = overrunContext(ctx, j)

	err = errPanicked // until send returns: a panic finishes the job with it
	defer func() {
		if err != nil || !rows {
			o.finish(err)
		}
	}()
	err = overran(o.qctx, send(q, o.qctx))
	return err
}

// decideForPool decides j, a job of the pool, in the engine e: before it takes a connection
// from pool, then takes one for it once admitted (acquireAdmitted), or takes one to decide it
// there when its cost needs an EXPLAIN (acquireExplained), or when its rules were replaced
// while it waited for room on the connection it took (decideOn). Held back by health on a
// connection it took, or that connection closed while it was held back there, it gives the
// connection back and is decided again before one (decideAgain). It returns the context the
// engine's last decision returned, where to send j, and what gives the connection back.
func decideForPool(ctx context.Context, pool connPool, e *engine.Engine, j job) (
	sctx context.Context, q querier, release releaser, err error) {
	for again := true; again; again = decideAgain(err) {
		sctx, err = j.begin(ctx, e, beforeConn, nil)
		switch err {
		case nil:
			if q, release, err = acquireAdmitted(sctx, pool, j); err == engine.ErrDecideAgain {
				sctx, q, release, err = decideOn(ctx, q, release, e, j)
			}
		case engine.ErrNeedConn:
			sctx, q, release, err = acquireExplained(ctx, pool, e, j)
		}
	}
	return sctx, q, release, err
}

// decideAgain reports whether a statement or batch of the pool that took a connection is
// decided again before one: held back by health there (engine.ErrWaitBeforeConn), or that
// connection closed while the engine held it back (errConnClosed).
func decideAgain(err error) bool { return err == engine.ErrWaitBeforeConn || err == errConnClosed }

// errConnClosed is the outcome of a statement or batch not sent because the connection it was
// decided on closed while the engine held it back (checkConn).
var errConnClosed = errors.New("pgtraffic: the connection closed while the statement was held back; not sent")

// abandoned is what a job of the pool not sent after all is abandoned with (job.Abandon) for
// err: one whose connection closed while the engine held it back there (errConnClosed) is
// decided again before another as the same job, as one that health sent back is
// (engine.ErrWaitBeforeConn): its span goes on, and it keeps its place of arrival.
func abandoned(err error) error {
	if err == errConnClosed {
		return engine.ErrWaitBeforeConn
	}
	return err
}

// pingAfter is how long a connection sits idle, its statement held back by the engine, before
// checkConn pings it. pgx's stdlib and pgxpool ping a connection idle for over a second before
// they hand it out, but the engine's wait is a new idle time after that check, in which the
// server (idle_session_timeout), a proxy or an operator may close the connection: so a wait of
// a tenth of a second, beside which a ping's round trip is small, is checked. A shorter hold
// (an EXPLAIN, which used the connection, or a brief wait) is not.
const pingAfter = 100 * time.Millisecond

// checkConn checks conn, idle for held while the engine held its statement back on it
// (engine.Exec.Held: an EXPLAIN, a wait for capacity), before the statement is sent there: the
// server (idle_session_timeout, a restart, pg_terminate_backend) or a proxy may have closed it
// meanwhile. It is closed (an EXPLAIN that failed with it shows here at no cost), or, after
// pingAfter or more, it does not answer a ping. It returns nil when conn is fit to send on,
// errConnClosed when it is not, ctx's error when ctx ended during the ping. A statement no one
// held back is not checked (held 0), nor a connection still busy with the caller's rows, which
// pgx answers as it would without pgtraffic.
func checkConn(ctx context.Context, conn *pgx.Conn, held time.Duration) error {
	if held <= 0 || conn == nil { // nil: a fake in unit tests
		return nil
	}
	pc := conn.PgConn()
	switch {
	case pc.IsClosed():
		return errConnClosed
	case held < pingAfter || pc.IsBusy():
		return nil
	}
	if err := pc.Ping(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if pc.IsClosed() {
			return errConnClosed
		}
	}
	return nil
}

// badConn checks conn, database/sql's, after the engine held j back on it for held (checkConn):
// one that closed meanwhile ends j unsent, at no cost (Abandon), and answers driver.ErrBadConn,
// so that database/sql retries the statement on another connection, where it is decided again
// as a new statement, as pgx's stdlib answers for a connection found closed before anything
// was sent.
func badConn(sctx context.Context, j job, conn *pgx.Conn, held time.Duration) error {
	err := checkConn(sctx, conn, held)
	if err != nil {
		j.Abandon(sctx, err)
	}
	if err == errConnClosed {
		return driver.ErrBadConn
	}
	return err
}

// named is the text and arguments the engine decides a statement by. For a statement whose
// arguments hold pgx.NamedArgs or pgx.StrictNamedArgs (@name placeholders), or a pointer to
// one (pgx takes either as its QueryRewriter), they are the positional text and values pgx
// sends, so that the guards, the pattern and EXPLAIN read what the server runs: pg_query reads
// "@name" as the operator @ applied to a column, which a guard took for a restriction of the
// target's rows (delete from t where @all). pgx still rewrites the caller's own text and
// arguments as it sends them. Another pgx.QueryRewriter is left to pgx (it may need the
// connection), its statement decided by its own text; so is a rewrite that fails, which pgx
// reports, and a nil pointer, on which pgx's own call fails.
func named(ctx context.Context, text string, args []any) (string, []any) {
	for k, a := range args {
		var rw pgx.QueryRewriter
		switch v := a.(type) {
		case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			continue // a leading option, as pgx takes them
		case pgx.NamedArgs:
			rw = v
		case pgx.StrictNamedArgs:
			rw = v
		case *pgx.NamedArgs:
			if v == nil {
				return text, args
			}
			rw = *v
		case *pgx.StrictNamedArgs:
			if v == nil {
				return text, args
			}
			rw = *v
		default:
			return text, args
		}
		q, values, err := rw.RewriteQuery(ctx, nil, text, args[k+1:])
		if err != nil {
			return text, args
		}
		out := make([]any, 0, k+len(values))
		return q, append(append(out, args[:k]...), values...)
	}
	return text, args
}
