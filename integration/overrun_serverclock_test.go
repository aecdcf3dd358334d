package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	pgtdriver "github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// A pattern on the server's clock (pg_stat_statements: a primary-key lookup, microseconds on
// the server) whose rows the application holds open a while before reading them. The README:
// on the server's clock a statement is charged the server's mean, "the server's reports, not
// the client's wall clock" (the app's time between rows is charged only without it); the
// quarantine counts a statement "whose measured cost exceeded its per_query_limit". The
// lookup's cost never came near the budget's per_query_limit (100ms), so two slow reads of its
// rows must not quarantine it.
func TestOverrunServerClockStrike(t *testing.T) {
	srv := pgtest.Shared(t)
	ctx := context.Background()
	dsn, _ := lookupDatabase(t, srv)
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 2
	cfg, err := pgtdriver.ParseConfig([]byte(`
server_cores: 1
health_interval: 500ms
budgets:
  - {name: lookups, mode: enforce, per_query_limit: 100ms, quarantine: {after: 2, for: 30s}}
rules:
  - {budget: lookups, match: {table: t}}
`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := pgtdriver.NewPoolFromConfig(ctx, pc, pgtdriver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		var v int
		if err := p.QueryRow(ctx, ssLookup, i%1000+1).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if ps, ok := lookupStatus(p.Snapshot()); ok && ps.Clock == pgtdriver.ClockServer {
			t.Logf("on the server's clock: %+v", ps)
			break
		}
		if time.Now().After(deadline) {
			ps, _ := lookupStatus(p.Snapshot())
			t.Fatalf("the lookup never went on the server's clock: %+v", ps)
		}
		time.Sleep(2 * time.Millisecond)
	}
	for i := range 2 {
		rows, err := p.Query(ctx, ssLookup, i+1)
		if err != nil {
			t.Fatalf("slow read %d: %v", i, err)
		}
		time.Sleep(300 * time.Millisecond) // the application is busy before it reads
		for rows.Next() {
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			t.Fatalf("slow read %d: %v", i, err)
		}
	}
	var v int
	err = p.QueryRow(ctx, ssLookup, 5).Scan(&v)
	var be *pgtdriver.BlockedError
	if errors.As(err, &be) {
		ps, _ := lookupStatus(p.Snapshot())
		t.Errorf("a lookup on the server's clock (server mean %gs, learned cost %gs) is refused after two slow reads of its rows: %v",
			ps.ServerMean, ps.MeanCost, err)
	} else if err != nil {
		t.Fatal(err)
	}
	t.Logf("quarantines %+v", p.Snapshot().Quarantines)
}
