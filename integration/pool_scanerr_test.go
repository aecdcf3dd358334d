package integration

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestPoolScanErrorReleasesLikePgxpool: a Pool has "pgxpool's query surface", and with no
// rules (or rules that admit) it should behave as pgxpool does. pgxpool's rows give the
// connection back as soon as Scan or Values fails (pgx closes its rows on a scan error, and
// pgxpool's rows release the connection there), so the common loop
//
//	for rows.Next() { if err := rows.Scan(&v); err != nil { return err } }
//
// without a deferred Close leaks nothing under pgxpool. A Pool's rows end their statement there
// too: the pool connection goes back and the budget slot is freed at once, not when the garbage
// collector finds the rows, so a small pool (or a max_concurrent budget) does not run dry where
// pgxpool's would not.
func TestPoolScanErrorReleasesLikePgxpool(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	plain, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	ctx := tagging.With(context.Background(), "app", "x")
	// pgxpool: the failed Scan released the connection.
	rows, err := plain.Query(ctx, "select 'not a number'::text")
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if !rows.Next() {
		t.Fatal("no row")
	}
	if err := rows.Scan(&n); err == nil {
		t.Fatal("scanning text into an int succeeded")
	}
	if got := plain.Stat().AcquiredConns(); got != 0 {
		t.Fatalf("pgxpool itself holds %d connections after a failed Scan (the premise is wrong)", got)
	}

	p, _ := openPool(t, `budgets: [{name: b, mode: enforce, max_concurrent: 1}]
rules: [{budget: b, match: {app: x}}]
`)
	for _, tags := range []string{"no budget", "budget"} {
		c := context.Background()
		if tags == "budget" {
			c = ctx
		}
		rows, err := p.Query(c, "select 'not a number'::text")
		if err != nil {
			t.Fatal(err)
		}
		if !rows.Next() {
			t.Fatal("no row")
		}
		if err := rows.Scan(&n); err == nil {
			t.Fatal("scanning text into an int succeeded")
		}
		// The caller returns the error here, as it may with pgxpool: no Close.
		if got := p.Stat().AcquiredConns(); got != 0 {
			t.Errorf("%s: %d pool connections still acquired after a failed Scan; pgxpool gives it back", tags, got)
		}
		if b := poolBudget(t, p, "b"); b.InFlight != 0 {
			t.Errorf("%s: budget still has %d in flight after a failed Scan", tags, b.InFlight)
		}
		rows.Close() // for the next round
	}
}
