package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestAdmissionHealthWaitersHoldNoConnAtStart: on driver.NewPool "what refuses a statement
// whatever it costs (a health threshold, ...) is decided before even that [the EXPLAIN], and a
// statement held back by it waits in the budget's queue holding no connection". A pool that
// starts while the server is unhealthy (custom.gate over its threshold) gets its first
// statements before the health sampler's first read: they pass the health check ("not read
// yet"), take a pool connection for their pattern's first EXPLAIN (which here waits on a lock,
// as an EXPLAIN may), and are then held back by the first sample on that connection. They give
// it back and wait for health holding none, rather than hold the pool's connections for their
// whole max_wait: the rest of the application (an uncontrolled checkout) gets one at once.
func TestAdmissionHealthWaitersHoldNoConnAtStart(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	bg := context.Background()
	admin, err := pgx.Connect(bg, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(bg)
	if _, err := admin.Exec(bg, "create table gate (v int); insert into gate values (5); create table orders (id int, total int)"); err != nil {
		t.Fatal(err)
	}
	// The reports' table is locked by a migration for a moment: their EXPLAINs wait on it.
	tx := lockTable(t, dsn, "orders")

	cfg, err := driver.ParseConfig([]byte(`
health_interval: 100ms
health_queries:
  gate: "select v from gate"
budgets:
  - {name: reports, mode: enforce, server_share: 0.5, max_wait: 30s, throttle_when: {custom.gate: 1}}
rules:
  - {budget: reports, match: {app: reporting}}
`))
	if err != nil {
		t.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 2
	p, err := driver.NewPoolFromConfig(bg, pc, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	// Two reports of patterns not yet costed, sent as the application starts.
	ctx := tagging.With(bg, "app", "reporting")
	reports := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, err := p.Exec(ctx, fmt.Sprintf("select sum(total) as s%d from orders where id > $1", i), i)
			reports <- err
		}()
	}
	// The first health sample is in: a report now is held back for health before anything.
	waitFor(t, 15*time.Second, "the first health sample", func() (bool, string) {
		err := p.Check(ctx)
		return err != nil, fmt.Sprint(err)
	})
	// The migration commits: the EXPLAINs complete.
	if err := tx.Commit(bg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "both reports waiting for health", func() (bool, string) {
		n := poolBudget(t, p, "reports").Waiting
		return n == 2, fmt.Sprintf("%d waiting", n)
	})
	// Each report gives back the connection it took for its EXPLAIN as it starts waiting.
	var held int32
	eventually(5*time.Second, func() bool { held = p.Stat().AcquiredConns(); return held == 0 })

	// The checkout path, which no budget selects.
	cctx, cancel := context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	start := time.Now()
	_, checkoutErr := p.Exec(cctx, "select 1")
	took := time.Since(start)
	t.Logf("reports waiting for health hold %d of the pool's 2 connections; the checkout: %v after %v", held, checkoutErr, took)
	if held != 0 {
		t.Errorf("the reports held back for health hold %d of the pool's 2 connections, want 0", held)
	}
	if checkoutErr != nil {
		t.Errorf("checkout beside reports waiting for health: %v after %v (the reports' max_wait is 30s)", checkoutErr, took)
	}

	// Health comes back: the reports run.
	if _, err := admin.Exec(bg, "update gate set v = 0"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case err := <-reports:
			if err != nil {
				t.Errorf("report: %v", err)
			}
		case <-time.After(40 * time.Second):
			t.Fatal("a report never returned")
		}
	}
}
