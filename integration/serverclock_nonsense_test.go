package integration

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// TestServerClockNonsenseHugeTimes: pg_stat_statements reports, for the lookup, execution times
// a million times the real ones (a 50 µs lookup claims 50 s: below the reader's bound of a day
// per call, but beyond what the client waited for it). README: a pg_stat_statements returning
// nonsense never fails or slows a statement; it falls back to the client's clock and counts
// the event. Under an enforce server_share budget the lookups keep running, charged on the
// client's clock, and the reports are counted rejected. (Believed, the nonsense priced the
// lookup at 17 s, refused every lookup, and trued the first charges up into a debt that kept
// the budget shut for hours.)
func TestServerClockNonsenseHugeTimes(t *testing.T) {
	nonsenseCounters(t, "r.calls", "r.total_exec_time * 1e6")
}

// TestServerClockNonsenseOther: negative and NaN times, calls going backwards. The same.
func TestServerClockNonsenseOther(t *testing.T) {
	for _, c := range []struct{ name, calls, exec string }{
		{"negative", "r.calls", "-r.total_exec_time"},
		{"NaN", "r.calls", "'NaN'::float8"},
		{"calls backwards", "1000000000 - r.calls", "r.total_exec_time"},
	} {
		t.Run(c.name, func(t *testing.T) { nonsenseCounters(t, c.calls, c.exec) })
	}
}

// nonsenseCounters replaces pg_stat_statements(boolean) in a lookup database by a function
// returning the real rows with calls and total_exec_time rewritten (expressions of the real row
// r), as a broken wrapper could, and runs the lookups under an enforce budget.
func nonsenseCounters(t *testing.T, callsExpr, execExpr string) {
	srv := pgtest.Shared(t)
	ctx := context.Background()
	dsn, admin := lookupDatabase(t, srv)
	if _, err := admin.Exec(ctx, `alter function pg_stat_statements(boolean) rename to pss_real;
		create function pg_stat_statements(showtext boolean) returns table(userid oid, dbid oid, toplevel bool, queryid int8,
			calls int8, total_exec_time float8, total_plan_time float8)
		language sql as $$ select r.userid, r.dbid, r.toplevel, r.queryid, `+callsExpr+`, `+execExpr+`, r.total_plan_time
			from pss_real(showtext) r $$`); err != nil {
		t.Fatal(err)
	}
	cfg, err := driver.ParseConfig([]byte(`
server_cores: 1
health_interval: 250ms
budgets:
  - {name: lookups, mode: enforce, server_share: 0.5, max_wait: 200ms}
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

	var (
		stop              atomic.Bool
		ok, refused, errs atomic.Int64
		firstErr          atomic.Value
		wg                sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			for !stop.Load() {
				var v int
				err := p.QueryRow(ctx, ssLookup, rand.IntN(1000)+1).Scan(&v)
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, driver.ErrBlocked):
					refused.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				default:
					errs.Add(1)
				}
			}
		})
	}
	// 20 intervals: enough for the pattern's EXPLAIN, the baseline read and many reports.
	time.Sleep(5 * time.Second)
	ok0, refused0 := ok.Load(), refused.Load()
	time.Sleep(3 * time.Second)
	okN, refusedN := ok.Load()-ok0, refused.Load()-refused0
	stop.Store(true)
	wg.Wait()
	snap := p.Snapshot()
	ps, _ := lookupStatus(snap)
	var real float64
	if err := admin.QueryRow(ctx, `select coalesce(sum(total_exec_time) / nullif(sum(calls), 0) / 1e3, 0) from pss_real(true)
		where query = $1 and toplevel`, ssLookup).Scan(&real); err != nil {
		t.Fatal(err)
	}
	t.Logf("last 3 s: %d lookups ran, %d refused (%v), %d other errors; pattern clock %q, learned %.3g s, server mean %.3g s, real server mean %.3g s; counters reads %d failures %d resets %d rejected %d",
		okN, refusedN, firstErr.Load(), errs.Load(), ps.Clock, ps.MeanCost, ps.ServerMean, real, snap.Counters.ServerClockReads,
		snap.Counters.ServerClockFailures, snap.Counters.ServerClockResets, snap.Counters.ServerClockRejected)
	if errs.Load() > 0 {
		t.Errorf("%d lookups failed with errors other than a refusal", errs.Load())
	}
	if refusedN > 0 && refusedN*10 > okN {
		t.Errorf("a pg_stat_statements returning nonsense (a 50 µs lookup reported at %.3g s, thousands of server seconds per %s read) "+
			"must not fail callers' statements: in 3 s %d lookups were refused and %d ran (budget server_share 0.5 of 1 core, 4 workers)",
			ps.ServerMean, "250ms", refusedN, okN)
	}
	if ps.Clock != driver.ClockClient {
		t.Errorf("nonsense counters: want the lookup on the client's clock, got %q (learned %.3g s, %.0f× the real server mean %.3g s)",
			ps.Clock, ps.MeanCost, ps.MeanCost/real, real)
	}
	if snap.Counters.ServerClockRejected == 0 && snap.Counters.ServerClockResets == 0 {
		t.Errorf("nonsense counters: want the event counted (server_clock.rejected), got 0 (resets %d, failures %d)",
			snap.Counters.ServerClockResets, snap.Counters.ServerClockFailures)
	}
}
