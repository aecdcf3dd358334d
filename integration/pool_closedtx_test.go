package integration

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestPoolClosedTxLeavesOtherTxAlone: a statement sent on a transaction that has already
// committed is a bug pgx makes harmless: pgx's (and pgxpool's) Tx returns pgx.ErrTxClosed and
// sends nothing, because the connection it ran on has gone back to the pool and may be another
// goroutine's. The README says the pool's transactions are pgx's, controlled; design.md that
// Begin returns "a pgx.Tx whose statements are controlled". So the closed transaction's
// statement must return ErrTxClosed and touch no connection.
//
// Were pgtraffic to decide the statement first, on the connection pgx's closed Tx still points
// to (pgxpool.Tx.Conn), it would, for a pattern not yet costed under a server_share budget, run
// its EXPLAIN there, inside whatever that connection is doing now. Here the pool's only connection
// has been taken by a second, REPEATABLE READ, transaction that has not run a statement yet:
// the stray EXPLAIN fixes that transaction's snapshot, so a row committed afterwards, before
// its first statement, is invisible to it. (With another goroutine using the connection at the
// same moment, it is concurrent use of one *pgx.Conn.)
func TestPoolClosedTxLeavesOtherTxAlone(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	cfg, err := driver.ParseConfig([]byte(`budgets: [{name: all, mode: enforce, server_share: 1, burst_limit: 1000s}]
rules: [{budget: all, match: {app: t}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 1 // the second transaction gets the connection the first one gave back
	p, err := driver.NewPoolFromConfig(context.Background(), pc, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx := tagging.With(context.Background(), "app", "t")
	if _, err := p.Exec(ctx, "create table items (id int)"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, "insert into items values (1)"); err != nil {
		t.Fatal(err)
	}

	tx1, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tx2, err := p.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx)

	explains := p.Snapshot().Counters.ExplainCalls
	var n int
	// A new pattern on the committed transaction: pgx answers ErrTxClosed.
	err = tx1.QueryRow(ctx, "select count(*) from items where id > $1", 0).Scan(&n)
	if !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("statement on a committed transaction: %v, want pgx.ErrTxClosed", err)
	}
	strayExplains := p.Snapshot().Counters.ExplainCalls - explains

	// Another session commits a row before tx2's first statement.
	raw, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close(context.Background())
	if _, err := raw.Exec(context.Background(), "insert into items values (2)"); err != nil {
		t.Fatal(err)
	}
	// REPEATABLE READ takes its snapshot at the transaction's first statement: this one.
	if err := tx2.QueryRow(ctx, "select count(*) from items").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("tx2's first statement sees %d rows, want 2: its snapshot was taken earlier, by the "+
			"committed tx1's statement, which ran %d EXPLAIN(s) on the connection tx2 now holds", n, strayExplains)
	}
}
