package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// TestClockBatchPatternInSnapshot: an application that sends its lookups in pgx batches
// (pool.SendBatch, which the README lists among the controlled calls) under a server_share
// budget. The README says "Snapshot and the status page say, per pattern, which clock its cost
// is on (clock), the server's mean (server_mean_s) beside the learned cost"; the issue asks that
// they show "per pattern, the server's mean execution time beside the prediction". The batch's
// statements are explained, their query identifier read from pg_stat_statements and the batch
// charged on the server's clock, so a user expects the lookup pattern on the status page with
// clock "server", although a batch's statements never train the model.
func TestClockBatchPatternInSnapshot(t *testing.T) {
	srv := pgtest.Shared(t)
	ctx := context.Background()
	dsn, _ := lookupDatabase(t, srv)
	cfg, err := driver.ParseConfig([]byte(`
health_interval: 100ms
budgets:
  - {name: lookups, mode: warn, server_share: 0.5}
rules:
  - {budget: lookups, match: {table: t}}
`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := driver.NewPool(ctx, dsn, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitFor(t, 20*time.Second, "the batched lookup pattern in the snapshot, on the server's clock", func() (bool, string) {
		b := &pgx.Batch{}
		for range 4 {
			b.Queue(ssLookup, rand.IntN(1000)+1)
		}
		if err := p.SendBatch(ctx, b).Close(); err != nil {
			t.Fatalf("a batch failed: %v", err)
		}
		s := p.Snapshot()
		ps, ok := lookupStatus(s)
		return ok && ps.Clock == driver.ClockServer, fmt.Sprintf("pattern listed %v (%+v) of %d patterns; server clock reads %d",
			ok, ps, len(s.Patterns), s.Counters.ServerClockReads)
	})
}

// TestClockBatchPatternWithoutStatStatements: without pg_stat_statements, Snapshot and the
// status page still say per pattern which clock its cost is on. An application whose lookups
// only run in pgx batches (pool.SendBatch) under a server_share budget, in a database without
// the extension: the batches are costed and charged (the budget's debt grows) on the client's
// clock, and the lookup pattern is in Snapshot.Patterns with clock "client", although a
// batch's statements are not timed apart and so never train its cost (its cost is what its
// plan predicts).
func TestClockBatchPatternWithoutStatStatements(t *testing.T) {
	srv := pgtest.Shared(t)
	ctx := context.Background()
	dsn := srv.CreateDatabase(t) // no pg_stat_statements created here
	lookupTable(t, dsn)
	cfg, err := driver.ParseConfig([]byte(`
health_interval: 100ms
budgets:
  - {name: lookups, mode: enforce, server_share: 0.0001, burst_limit: 1000s}
rules:
  - {budget: lookups, match: {table: t}}
`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := driver.NewPool(ctx, dsn, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	end := time.Now().Add(3 * time.Second)
	batches := 0
	for time.Now().Before(end) {
		b := &pgx.Batch{}
		for range 4 {
			b.Queue(ssLookup, rand.IntN(1000)+1)
		}
		if err := p.SendBatch(ctx, b).Close(); err != nil {
			t.Fatalf("a batch failed: %v", err)
		}
		batches++
	}
	s := p.Snapshot()
	ps, ok := lookupStatus(s)
	t.Logf("%d batches; budget debt %.6f s; pattern listed %v (%+v) of %d patterns; counters %+v",
		batches, lookupsDebt(s), ok, ps, len(s.Patterns), s.Counters)
	if lookupsDebt(s) <= 0 {
		t.Fatalf("the batches were not charged to the budget")
	}
	if !ok || ps.Clock != driver.ClockClient {
		t.Errorf("the batched lookup pattern, charged on the client's clock, is not in the snapshot with clock %q: listed %v (%+v), patterns %s",
			driver.ClockClient, ok, ps, fmt.Sprint(s.Patterns))
	}
}
