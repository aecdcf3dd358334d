package integration

import (
	"context"
	"database/sql"
	"errors"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// leakRows starts a query and drops its rows without Close, as a forgotten defer rows.Close()
// does.
//
//go:noinline
func leakRows(t *testing.T, db *sql.DB, ctx context.Context) {
	rows, err := db.QueryContext(ctx, "select g from generate_series(1, 1000) g")
	if err != nil {
		t.Fatal(err)
	}
	if !rows.Next() {
		t.Fatalf("no row: %v", rows.Err())
	}
}

// TestLeakedRowsReleaseTheirSlots: with max_concurrent: 2, two rows never closed (context
// Background, so database/sql never closes them) used to wedge the budget for good. Once the
// garbage collector finds them their slots come back, counted in pgtraffic.rows.leaked and
// logged.
func TestLeakedRowsReleaseTheirSlots(t *testing.T) {
	var logs lockedBuffer
	reader := sdkmetric.NewManualReader()
	c, db := openRules(t, `
budgets:
  - {name: reports, mode: enforce, max_concurrent: 2}
rules:
  - {budget: reports, match: {app: reports}}
`, driver.WithLogger(logs.logger()), driver.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	ctx := tagging.With(context.Background(), "app", "reports")
	// No collection but the test's own: one between the leak and the check below would reclaim
	// the slots before the check sees them held.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	leakRows(t, db, ctx)
	leakRows(t, db, ctx)
	if _, err := db.QueryContext(ctx, "select 1"); !errors.Is(err, driver.ErrBlocked) {
		t.Fatalf("a third statement while two leaked rows hold the slots: %v, want blocked", err)
	}
	for i := 0; i < 1000 && budgetStatus(t, c, "reports").InFlight != 0; i++ {
		runtime.GC() // the cleanups run on their own goroutine once a collection finds the rows
	}
	if n := budgetStatus(t, c, "reports").InFlight; n != 0 {
		t.Fatalf("in flight after collections: %d, want the leaked slots back", n)
	}
	var one int
	if err := db.QueryRowContext(ctx, "select 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("a statement after the leaked rows were collected: %d, %v", one, err)
	}
	leaked := leakedCount(t, reader)
	if leaked != 2 {
		t.Errorf("pgtraffic.rows.leaked = %d, want 2", leaked)
	}
	if !waitLogged(&logs, "rows garbage-collected without Close") {
		t.Errorf("no warning logged:\n%s", logs.String())
	}
}

// waitLogged waits a while for substr in logs, and reports whether it came: the leak cleanup
// logs its warning once it has given the slot back (driver/leak.go, reclaim).
func waitLogged(logs *lockedBuffer, substr string) bool {
	for deadline := time.Now().Add(10 * time.Second); !contains(logs.String(), substr); {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// leakedCount is the pgtraffic.rows.leaked counter's total in reader.
func leakedCount(t *testing.T, reader *sdkmetric.ManualReader) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var leaked int64 = -1
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "pgtraffic.rows.leaked" {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok || !sum.IsMonotonic {
				t.Fatalf("pgtraffic.rows.leaked is %T, want a monotonic int64 sum", m.Data)
			}
			leaked = 0
			for _, dp := range sum.DataPoints {
				leaked += dp.Value
			}
		}
	}
	return leaked
}

// leakPoolRows starts a query on the pool and drops its rows without Close.
//
//go:noinline
func leakPoolRows(t *testing.T, p *driver.Pool, ctx context.Context) {
	rows, err := p.Query(ctx, "select g from generate_series(1, 1000) g")
	if err != nil {
		t.Fatal(err)
	}
	if !rows.Next() {
		t.Fatalf("no row: %v", rows.Err())
	}
}

// TestPoolLeakedRowsReleaseTheirSlots: the pgx-native pool's rows never closed give back their
// budget slots and their pool connections once collected, counted and logged as the database/sql
// driver's are.
func TestPoolLeakedRowsReleaseTheirSlots(t *testing.T) {
	var logs lockedBuffer
	reader := sdkmetric.NewManualReader()
	p, _ := openPool(t, `
budgets:
  - {name: reports, mode: enforce, max_concurrent: 2}
rules:
  - {budget: reports, match: {app: reports}}
`, driver.WithLogger(logs.logger()), driver.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	ctx := tagging.With(context.Background(), "app", "reports")
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // as in TestLeakedRowsReleaseTheirSlots
	leakPoolRows(t, p, ctx)
	leakPoolRows(t, p, ctx)
	if _, err := p.Exec(ctx, "select 1"); !errors.Is(err, driver.ErrBlocked) {
		t.Fatalf("a third statement while two leaked rows hold the slots: %v, want blocked", err)
	}
	if n := p.Stat().AcquiredConns(); n != 2 {
		t.Fatalf("acquired pool connections with two rows open: %d, want 2", n)
	}
	for i := 0; i < 1000 && (poolBudget(t, p, "reports").InFlight != 0 || p.Stat().AcquiredConns() != 0); i++ {
		runtime.GC()
	}
	if n := poolBudget(t, p, "reports").InFlight; n != 0 {
		t.Fatalf("in flight after collections: %d, want the leaked slots back", n)
	}
	if n := p.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("acquired pool connections after collections: %d, want them back", n)
	}
	var one int
	if err := p.QueryRow(ctx, "select 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("a statement after the leaked rows were collected: %d, %v", one, err)
	}
	if n := leakedCount(t, reader); n != 2 {
		t.Errorf("pgtraffic.rows.leaked = %d, want 2", n)
	}
	if !waitLogged(&logs, "pool connection destroyed") {
		t.Errorf("no warning logged:\n%s", logs.String())
	}
}

// TestLeakedRowsLoggedByFingerprintAtMostASecond: rows leaked in a loop log their warning at
// most a line a second, with how many were suppressed, and name their statement by its
// fingerprint; the counter counts every one. Before, each leak logged a line of its own, with
// nothing to find the statement by.
func TestLeakedRowsLoggedByFingerprintAtMostASecond(t *testing.T) {
	var logs lockedBuffer
	reader := sdkmetric.NewManualReader()
	c, db := openRules(t, `
budgets:
  - {name: reports, mode: enforce, max_concurrent: 20}
rules:
  - {budget: reports, match: {app: reports}}
`, driver.WithLogger(logs.logger()), driver.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	ctx := tagging.With(context.Background(), "app", "reports")
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // as in TestLeakedRowsReleaseTheirSlots
	const leaks = 20                                 // each holds a connection of database/sql's for good
	for range leaks {
		leakRows(t, db, ctx)
	}
	for i := 0; i < 1000 && budgetStatus(t, c, "reports").InFlight != 0; i++ {
		runtime.GC()
	}
	if n := leakedCount(t, reader); n != leaks {
		t.Fatalf("pgtraffic.rows.leaked = %d, want %d", n, leaks)
	}
	if !waitLogged(&logs, "fingerprint=") {
		t.Fatalf("no leak warning naming its statement's fingerprint:\n%s", logs.String())
	}
	if lines := strings.Count(logs.String(), "garbage-collected without Close"); lines >= leaks/2 {
		t.Errorf("%d leaks collected together logged %d lines, want a line a second:\n%s", leaks, lines, logs.String())
	}
}
