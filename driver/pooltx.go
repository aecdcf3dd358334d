package driver

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pgxTx is a transaction of a [Pool] (or a savepoint within one): pgx's transaction, whose
// statements go through the engine on the transaction's connection. Commit, Rollback,
// Prepare, LargeObjects and Conn are pgx's (statements sent on Conn bypass control). Like
// pgx's transactions it is used by one goroutine at a time.
type pgxTx struct {
	pgx.Tx
	run *runner
}

var _ pgx.Tx = (*pgxTx)(nil)

// Begin starts a nested transaction (a savepoint), controlled like this one.
func (t *pgxTx) Begin(ctx context.Context) (pgx.Tx, error) {
	inner, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &pgxTx{Tx: inner, run: t.run}, nil
}

func (t *pgxTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.run.exec(ctx, t.Tx, t.Tx.Conn(), sql, args)
}

func (t *pgxTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.run.query(ctx, t.Tx, t.Tx.Conn(), sql, args, nil)
}

func (t *pgxTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := t.Query(ctx, sql, args...)
	return &pgxRow{rows: rows, err: err}
}

func (t *pgxTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return t.run.copyFrom(ctx, t.Tx, t.Tx.Conn(), table, columns, src)
}

func (t *pgxTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.run.sendBatch(ctx, t.Tx, t.Tx.Conn(), b, nil)
}
