package driver

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pgxTx is a transaction of a [Pool] (or a savepoint within one): pgx's transaction, whose
// statements go through the engine on the transaction's connection. Commit, Rollback and
// Prepare are pgx's with a little bookkeeping; LargeObjects and Conn are pgx's (statements
// sent on Conn bypass control). Like pgx's transactions it is used by one goroutine at a time.
type pgxTx struct {
	pgx.Tx
	run *runner
	// prepared maps the names of the statements prepared through the transaction (and its
	// nested ones, which share it) to their texts, so that a statement run by its name is
	// decided as its text.
	prepared map[string]string
	// release gives the pool's connection back when the transaction ends; nil when the pool's
	// own transaction (pgxpool.Tx) does, or for a nested one.
	release releaser
	// closed is set by Commit and Rollback; outermost is the transaction a nested one is a
	// savepoint in (nil for the outermost itself), whose end ends it too (ended).
	closed    bool
	outermost *pgxTx
}

var _ pgx.Tx = (*pgxTx)(nil)

// Begin starts a nested transaction (a savepoint), controlled like this one.
func (t *pgxTx) Begin(ctx context.Context) (pgx.Tx, error) {
	inner, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	outermost := t.outermost
	if outermost == nil {
		outermost = t
	}
	return &pgxTx{Tx: inner, run: t.run, prepared: t.prepared, outermost: outermost}, nil
}

// Commit commits, then releases the connection if the transaction holds it.
func (t *pgxTx) Commit(ctx context.Context) error {
	defer t.end()
	return t.Tx.Commit(ctx)
}

// Rollback rolls back, then releases the connection if the transaction holds it.
func (t *pgxTx) Rollback(ctx context.Context) error {
	defer t.end()
	return t.Tx.Rollback(ctx)
}

// ended reports whether t, or the outermost transaction it is a savepoint in, was committed or
// rolled back. Its statements then return pgx.ErrTxClosed without being decided, as pgx's
// savepoints do, which check their own end and the outermost's (a savepoint inside one that
// ended still sends its statements in the transaction): once the outermost ended, the
// connection pgx's transaction still points to is back in the pool, perhaps another
// goroutine's, and must not be sent an EXPLAIN.
func (t *pgxTx) ended() bool { return t.closed || t.outermost != nil && t.outermost.closed }

// dest is where the transaction's statements run: its connection, sent to through pgx's Tx,
// with the names of the statements prepared in it, and on the pool's connections.
func (t *pgxTx) dest() *dest {
	return &dest{q: t.Tx, conn: t.Tx.Conn(), prepared: t.prepared, names: &t.run.names}
}

func (t *pgxTx) end() {
	t.closed = true
	if r := t.release; r != nil {
		t.release = nil
		r.Release()
	}
}

// Prepare prepares sql on the transaction's connection as pgx does, and remembers the name: in
// the transaction, and pool-wide, as the statement stays prepared on the connection once the
// transaction ends.
func (t *pgxTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	sd, err := t.Tx.Prepare(ctx, name, sql)
	if err == nil && name != "" && name != sql {
		t.prepared[name] = sql
		t.run.names.record(preparedStmt{name: name, text: sql})
	}
	return sd, err
}

func (t *pgxTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.ended() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return t.run.exec(ctx, t.dest(), sql, args)
}

func (t *pgxTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.ended() {
		return errRows{err: pgx.ErrTxClosed}, pgx.ErrTxClosed
	}
	return t.run.query(ctx, t.dest(), sql, args)
}

func (t *pgxTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.ended() {
		return errRows{err: pgx.ErrTxClosed}
	}
	return t.run.queryRow(ctx, t.dest(), sql, args)
}

func (t *pgxTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if t.ended() {
		return 0, pgx.ErrTxClosed
	}
	return t.run.copyFrom(ctx, t.dest(), table, columns, src)
}

func (t *pgxTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.ended() {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return t.run.sendBatch(ctx, t.dest(), b)
}
