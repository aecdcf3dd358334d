package integration

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestBatchBeginTxBeginIsNotDecided: Pool.BeginTx's doc: "BEGIN, COMMIT and ROLLBACK are
// not decided (they cost the server nothing); the statements in between are". pgx's
// Batch.BeginTx "queues the query that begins a transaction ... saving the round trip that
// [Conn.BeginTx] spends on it", and the README's pool offers pgxpool's SendBatch (its
// BeginTx batches too: TestPoolBatchBeginTx). A rule that selects utility statements (the
// built-in tag statement=utility, here an incident block with max_concurrent: 0) does not
// stop Pool.BeginTx, nor a transaction's statements that are selects; nor may it stop a batch
// that begins its transaction with Batch.BeginTx and runs only a select: the BEGIN pgx queued
// for it is not a statement of the application's to decide (or count).
func TestBatchBeginTxBeginIsNotDecided(t *testing.T) {
	p := pendingPool(t, 2, `budgets: [{name: util, mode: enforce, max_concurrent: 0}]
rules: [{budget: util, match: {statement: utility}}]
`)
	ctx := context.Background()

	// Pool.BeginTx: BEGIN is not decided, and the select in the transaction is not a utility.
	tx, err := p.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		t.Fatalf("Pool.BeginTx: %v", err)
	}
	var n int
	if err := tx.QueryRow(ctx, "select 1").Scan(&n); err != nil {
		t.Fatalf("select in Pool.BeginTx's transaction: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// The same transaction begun by the batch itself.
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue("select 1")
	br := p.SendBatch(ctx, b)
	closeErr := br.Close()
	if tx := br.Tx(); tx != nil {
		tx.Rollback(ctx)
	}
	blocked := poolBudget(t, p, "util").Blocked
	if closeErr != nil {
		t.Errorf("a BeginTx batch running one select: %v (budget util counted %d blocked statements); "+
			"Pool.BeginTx's BEGIN is not decided", closeErr, blocked)
	}
	rvIdle(t, p, "util")
}
