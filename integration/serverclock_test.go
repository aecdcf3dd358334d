package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/delayproxy"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/internal/serverclock"
	clockconn "github.com/pgtraffic/pgtraffic/internal/serverclock/pgxconn"
)

// The server-seconds experiment: 8 workers run a primary-key lookup on 100,000 rows under a
// server_share budget on server_cores 1, with demand far above the budget (a share of 0.02: a
// client slowed by the race detector on a loaded machine still offers several times it; its
// burst of 100ms, ten times the default, holds the client's measurements of the first lookups,
// taken before the server's clock is read), on loopback and
// through a proxy of the test's own that adds a 1 ms round trip. With pg_stat_statements, the
// learned cost of the lookup must be the server's mean execution time (within 0.5–2×), and the
// server must spend 0.7–1.3 × what the budget allows over the window: server_share ×
// server_cores, plus the debt its bucket took on between the window's ends. Without it, nothing fails: costs stay
// on the client's clock (less the network's round trip), the failed reads are counted, and the
// figures are logged for integration/PERFORMANCE.md.
func TestServerSeconds(t *testing.T) {
	srv := pgtest.Shared(t)
	// The test reads pg_stat_statements itself from a database of its own, which sees every
	// database's counters: the workload's database may lack the extension.
	stats := srv.CreateDatabase(t)
	srv.EnableStatStatements(t, stats)
	for _, path := range []struct {
		name   string
		oneWay time.Duration
	}{{"loopback", 0}, {"1ms round trip", 500 * time.Microsecond}} {
		for _, withPSS := range []bool{true, false} {
			name := path.name + "/pg_stat_statements"
			if !withPSS {
				name = path.name + "/without pg_stat_statements"
			}
			t.Run(name, func(t *testing.T) {
				r := runServerSeconds(t, srv, stats, path.oneWay, withPSS)
				t.Logf("%s: learned mean cost %.0f µs (%s clock; client mean less floor %.0f µs, floor %v); server mean %.0f µs (learned ÷ server %.2f); "+
					"server seconds spent ÷ what the budget allowed (share × cores, and its debt's change) %.2f (demand above the budget: %v); %d lookups admitted, %d refused; server clock reads %d (%.0f µs each on the server), failures %d",
					name, r.learned*1e6, r.clock, r.client*1e6, r.floor, r.serverMean*1e6, r.learned/r.serverMean, r.spentShare, r.saturated,
					r.calls, r.refused, r.reads, r.readMean*1e6, r.failures)
				if !withPSS {
					// Nothing is asserted of the lookups run: on the client's clock a loaded
					// machine may teach the lookup a cost (tens of milliseconds, its scheduling
					// delays) that this tight budget then admits a few of a minute.
					if r.clock != driver.ClockClient || r.failures == 0 {
						t.Fatalf("without pg_stat_statements: clock %q, failures %d; want the client's clock and the failed reads counted", r.clock, r.failures)
					}
					return
				}
				if r.serverMean <= 0 || r.calls == 0 {
					t.Fatalf("the server reports no lookups: %+v", r)
				}
				if r.clock != driver.ClockServer || r.reads == 0 {
					t.Fatalf("clock %q after %d reads, want the server's", r.clock, r.reads)
				}
				if ratio := r.learned / r.serverMean; ratio < 0.5 || ratio > 2 {
					t.Errorf("learned cost %.0f µs is %.2f × the server's mean %.0f µs, want 0.5–2×", r.learned*1e6, ratio, r.serverMean*1e6)
				}
				// The lower bound holds only under demand above the budget: a client slowed down
				// enough (the race detector on a loaded machine, through the proxy) may not offer the
				// budget's share, and then the server spends what it is asked for.
				switch {
				case r.spentShare > 1.3:
					t.Errorf("the server spent %.2f × what the budget allowed, want at most 1.3×", r.spentShare)
				case r.spentShare < 0.7 && r.saturated:
					t.Errorf("the server spent %.2f × what the budget allowed under demand above the budget, want 0.7–1.3×", r.spentShare)
				case r.spentShare < 0.7:
					t.Logf("the demand stayed below the budget (its bucket mostly empty, nobody waiting): spent %.2f × share is what was asked", r.spentShare)
				}
			})
		}
	}
}

// lookupsDebt is the debt of the lookups budget in snap, execution seconds.
func lookupsDebt(snap driver.Snapshot) float64 {
	for _, b := range snap.Budgets {
		if b.Name == "lookups" {
			return b.Debt
		}
	}
	return 0
}

type serverSecondsRun struct {
	learned, client, serverMean, spentShare float64
	clock                                   string
	floor                                   time.Duration
	calls, refused                          int64
	reads, failures                         uint64
	readMean                                float64 // the server clock's read, mean server seconds
	// saturated: in at least half the window's looks the budget had statements waiting or its
	// bucket at least half full: the demand was above the budget.
	saturated bool
}

const (
	ssShare   = 0.02
	ssWarm    = 6 * time.Second
	ssMeasure = 6 * time.Second
	ssLookup  = `select v from t where id = $1`
)

func runServerSeconds(t *testing.T, srv *pgtest.Server, stats string, oneWay time.Duration, withPSS bool) serverSecondsRun {
	ctx := context.Background()
	dsn := srv.CreateDatabase(t)
	if withPSS {
		srv.EnableStatStatements(t, dsn)
	}
	setup, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	var dbid uint32
	if err := setup.QueryRow(ctx, `select oid from pg_database where datname = current_database()`).Scan(&dbid); err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Exec(ctx, `create table t (id int primary key, v int);
		insert into t select g, g from generate_series(1, 100000) g; analyze t`); err != nil {
		t.Fatal(err)
	}
	setup.Close(ctx)

	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 8
	if oneWay > 0 {
		px := delayproxy.Start(t, fmt.Sprintf("%s:%d", pc.ConnConfig.Host, pc.ConnConfig.Port), oneWay)
		pc.ConnConfig.Host, pc.ConnConfig.Port = px.HostPort()
	}
	cfg, err := driver.ParseConfig([]byte(fmt.Sprintf(`
server_cores: 1
health_interval: 250ms
budgets:
  - {name: lookups, mode: enforce, server_share: %g, burst_limit: 100ms, max_wait: 2s, max_queue: 16}
rules:
  - {budget: lookups, match: {table: t}}
`, ssShare)))
	if err != nil {
		t.Fatal(err)
	}
	p, err := driver.NewPoolFromConfig(ctx, pc, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	sc, err := pgx.Connect(ctx, stats)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close(ctx)
	counters := func() (calls int64, execMS float64) {
		t.Helper()
		if err := sc.QueryRow(ctx, `select coalesce(sum(calls), 0)::int8, coalesce(sum(total_exec_time), 0)
			from pg_stat_statements where dbid = $1 and toplevel and query = $2`, dbid, ssLookup).Scan(&calls, &execMS); err != nil {
			t.Fatal(err)
		}
		return calls, execMS
	}

	var (
		stop    atomic.Bool
		refused atomic.Int64
		wg      sync.WaitGroup
		failed  = make(chan error, 8)
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				var v int
				err := p.QueryRow(ctx, ssLookup, rand.IntN(100000)+1).Scan(&v)
				switch {
				case errors.Is(err, driver.ErrBlocked):
					refused.Add(1)
				case err != nil:
					failed <- err
					return
				}
			}
		}()
	}
	time.Sleep(ssWarm)
	if withPSS {
		// The window measures the server's clock: it opens once the lookup is on it. The first
		// report comes two reads after the first EXPLAIN, which a loaded machine may delay past
		// the warm-up (the race detector, every package's tests at once).
		waitFor(t, 4*ssWarm, "the lookup on the server's clock", func() (bool, string) {
			ps, ok := lookupStatus(p.Snapshot())
			return ok && ps.Clock == driver.ClockServer, fmt.Sprintf("%+v", ps)
		})
	}
	calls0, exec0 := counters()
	refused0 := refused.Load()
	debt0 := lookupsDebt(p.Snapshot())
	// The learned cost, averaged over the window as the server's mean is: one snapshot every
	// 250ms.
	var learned, client float64
	var samples, looks, full int
	t0 := time.Now()
	for time.Since(t0) < ssMeasure {
		time.Sleep(250 * time.Millisecond)
		snap := p.Snapshot()
		if ps, ok := lookupStatus(snap); ok {
			learned, client, samples = learned+ps.MeanCost, client+ps.ClientMean, samples+1
		}
		for _, b := range snap.Budgets {
			if b.Name == "lookups" {
				looks++
				if b.Waiting > 0 || b.Debt >= b.Burst/2 {
					full++ // demand above the budget: statements wait for its bucket
				}
			}
		}
	}
	calls1, exec1 := counters()
	elapsed := time.Since(t0).Seconds()
	refusedN := refused.Load() - refused0
	snap := p.Snapshot()
	stop.Store(true)
	wg.Wait()
	close(failed)
	for err := range failed {
		t.Fatalf("a lookup failed: %v", err)
	}

	r := serverSecondsRun{saturated: looks > 0 && 2*full >= looks, calls: calls1 - calls0, refused: refusedN, floor: snap.Counters.NetworkFloor,
		reads: snap.Counters.ServerClockReads, failures: snap.Counters.ServerClockFailures}
	if r.calls > 0 {
		r.serverMean = (exec1 - exec0) / 1e3 / float64(r.calls)
	}
	// What the budget allows in the window: its share of it, plus what its bucket took on (or
	// less what it drained) between the window's ends. Up to a burst (100ms) may come on top
	// of the share's 120ms in 6s, and the window's ends fall where the bucket happens to be.
	allowed := ssShare*1*elapsed + lookupsDebt(snap) - debt0
	r.spentShare = (exec1 - exec0) / 1e3 / allowed
	if ps, ok := lookupStatus(snap); ok {
		r.clock = ps.Clock
	}
	if samples > 0 {
		r.learned, r.client = learned/float64(samples), client/float64(samples)
	}
	if err := sc.QueryRow(ctx, `select coalesce(sum(total_exec_time) / nullif(sum(calls), 0) / 1e3, 0)
		from pg_stat_statements where dbid = $1 and query like 'select i.stats_reset%'`, dbid).Scan(&r.readMean); err != nil {
		t.Fatal(err)
	}
	if r.clock == "" {
		t.Fatalf("no lookup pattern in the snapshot: %+v", snap.Patterns)
	}
	return r
}

// TestServerClockReadCost measures what one read of the server clock costs the server with
// pg_stat_statements holding many entries and the reader asking for its largest number of
// query identifiers (logged for integration/PERFORMANCE.md; nothing is timed).
func TestServerClockReadCost(t *testing.T) {
	srv := pgtest.Shared(t)
	dsn := srv.CreateDatabase(t)
	srv.EnableStatStatements(t, dsn)
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	// Distinct statements, distinct query identifiers: the operators of 1 ? 1 ? 1 ... spell i
	// in base 4.
	const entries = 3000
	var b pgx.Batch
	for i := range entries {
		expr := "1"
		for d := i; d > 0 || expr == "1"; d /= 4 {
			expr += " " + string("+-*/"[d%4]) + " 1"
		}
		b.Queue("select " + expr)
	}
	if err := c.SendBatch(ctx, &b).Close(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := c.QueryRow(ctx, `select count(*) from pg_stat_statements`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	rows, err := c.Query(ctx, `select queryid from pg_stat_statements where queryid is not null limit $1`, serverclock.MaxQueryIDs)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clockconn.Connector(cfg, nil)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close(ctx)
	const reads = 50
	var got serverclock.Reading
	t0 := time.Now()
	for range reads {
		if got, err = rc.Read(ctx, ids); err != nil {
			t.Fatal(err)
		}
	}
	wall := time.Since(t0) / reads
	if len(got.Rows) == 0 {
		t.Fatal("the read returned none of the asked identifiers")
	}
	var meanMS float64
	if err := c.QueryRow(ctx, `select sum(total_exec_time) / sum(calls) from pg_stat_statements
		where query like 'select i.stats_reset%'`).Scan(&meanMS); err != nil {
		t.Fatal(err)
	}
	var scanMS float64 // pg_stat_statements' own scan of every entry, for comparison
	if err := c.QueryRow(ctx, `select count(*) from pg_stat_statements(false)`).Scan(new(int)); err != nil {
		t.Fatal(err)
	}
	if err := c.QueryRow(ctx, `select sum(total_exec_time) / sum(calls) from pg_stat_statements
		where query like 'select count(*) from pg_stat_statements(%'`).Scan(&scanMS); err != nil {
		t.Fatal(err)
	}
	t.Logf("one read asking %d identifiers of %d pg_stat_statements entries (%d returned): %.0f µs of server execution, %v on the client's clock (mean of %d); a bare count of the entries: %.0f µs",
		len(ids), n, len(got.Rows), meanMS*1e3, wall, reads, scanMS*1e3)
}

// lookupStatus returns the status of the lookup pattern (ssLookup) in snap, if it has one.
func lookupStatus(snap driver.Snapshot) (driver.PatternStatus, bool) {
	for _, ps := range snap.Patterns {
		if strings.Contains(ps.Query, "from t where id") {
			return ps, true
		}
	}
	return driver.PatternStatus{}, false
}

// lookupDatabase creates a database with pg_stat_statements and a table t of 1,000 rows (id,
// v), analysed, and returns its DSN and a connection to it, closed when the test ends.
func lookupDatabase(t *testing.T, srv *pgtest.Server) (string, *pgx.Conn) {
	t.Helper()
	dsn := srv.CreateDatabase(t)
	srv.EnableStatStatements(t, dsn)
	return dsn, lookupTable(t, dsn)
}

// lookupTable creates the lookups' table t (1,000 rows) in dsn's database, and returns a
// connection to it, closed when the test ends.
func lookupTable(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(ctx) })
	if _, err := admin.Exec(ctx, `create table t (id int primary key, v int);
		insert into t select g, g from generate_series(1, 1000) g; analyze t`); err != nil {
		t.Fatal(err)
	}
	return admin
}

// TestServerClockBadInput: pg_stat_statements reset, then dropped, under a running workload:
// no statement fails, the events are counted, and costs fall back to the client's clock.
func TestServerClockBadInput(t *testing.T) {
	srv := pgtest.Shared(t)
	ctx := context.Background()
	dsn, admin := lookupDatabase(t, srv)
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
	lookup := func() driver.PatternStatus {
		t.Helper()
		var v int
		if err := p.QueryRow(ctx, ssLookup, rand.IntN(1000)+1).Scan(&v); err != nil {
			t.Fatalf("a lookup failed: %v", err)
		}
		ps, _ := lookupStatus(p.Snapshot())
		return ps
	}
	// until runs lookups until cond holds of the snapshot, within a generous watchdog.
	until := func(what string, cond func(driver.PatternStatus, driver.Counters) bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			ps := lookup()
			if cond(ps, p.Snapshot().Counters) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: never; pattern %+v, counters %+v", what, ps, p.Snapshot().Counters)
			}
			time.Sleep(time.Millisecond)
		}
	}
	until("the server's clock", func(ps driver.PatternStatus, _ driver.Counters) bool { return ps.Clock == driver.ClockServer })
	if _, err := admin.Exec(ctx, `select pg_stat_statements_reset()`); err != nil {
		t.Fatal(err)
	}
	until("the reset counted", func(_ driver.PatternStatus, c driver.Counters) bool { return c.ServerClockResets > 0 })
	if _, err := admin.Exec(ctx, `drop extension pg_stat_statements`); err != nil {
		t.Fatal(err)
	}
	failures := p.Snapshot().Counters.ServerClockFailures
	until("the failed reads counted", func(_ driver.PatternStatus, c driver.Counters) bool { return c.ServerClockFailures > failures })
	until("back on the client's clock", func(ps driver.PatternStatus, _ driver.Counters) bool { return ps.Clock == driver.ClockClient })
}

// TestServerClockElection: instances that coordinate through Redis elect one server clock
// reader per database; the others adopt what it learned, reading pg_stat_statements not at all.
func TestServerClockElection(t *testing.T) {
	rs := redistest.Need(t)
	srv := pgtest.Shared(t)
	dsn, _ := lookupDatabase(t, srv)
	ins := openElected(t, rs, dsn, `
coordination: {sync_interval: 200ms}
health_interval: 200ms
budgets:
  - {name: lookups, mode: warn, server_share: 0.5}
rules:
  - {budget: lookups, match: {table: t}}
`, 3)
	waitFor(t, 30*time.Second, "one reader, the others adopting its means", func() (bool, string) {
		readers, onServer := 0, 0
		var state []string
		for _, in := range ins {
			var v int
			if err := in.db.QueryRow(ssLookup, rand.IntN(1000)+1).Scan(&v); err != nil {
				t.Fatalf("a lookup failed: %v", err)
			}
			s := in.c.Snapshot()
			if s.Counters.ServerClockReads > 0 {
				readers++
			}
			if ps, ok := lookupStatus(s); ok && ps.Clock == driver.ClockServer {
				onServer++
			}
			state = append(state, fmt.Sprintf("reads %d shared %d", s.Counters.ServerClockReads, s.Counters.ServerClockShared))
		}
		return readers == 1 && onServer == len(ins), fmt.Sprint(state)
	})
}

// TestFirstChargesTruedUpByTheServer: a deploy under a budget, through the test's 1 ms proxy:
// a pattern's first lookups are charged on the client's clock (each its round trip, less the
// smallest one, and the client's own time) until the server first reports the pattern (the
// reader needs two reads of its counters); that report trues each charge up to the server's
// mean, so once the reports are in the budget owes what the server spent, not what the client
// measured. Measured in one run: the budget's debt ÷ the server's execution seconds of the
// lookups (pg_stat_statements), within 0.5–2× (the budget drains a negligible 0.0001 s/s).
func TestFirstChargesTruedUpByTheServer(t *testing.T) {
	srv := pgtest.Shared(t)
	ctx := context.Background()
	dsn, admin := lookupDatabase(t, srv)
	var dbid uint32
	if err := admin.QueryRow(ctx, `select oid from pg_database where datname = current_database()`).Scan(&dbid); err != nil {
		t.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 4
	pc.ConnConfig.Host, pc.ConnConfig.Port = delayproxy.Start(t, fmt.Sprintf("%s:%d", pc.ConnConfig.Host, pc.ConnConfig.Port), 500*time.Microsecond).HostPort()
	cfg, err := driver.ParseConfig([]byte(`
server_cores: 1
health_interval: 500ms
budgets:
  - {name: lookups, mode: enforce, server_share: 0.0001, burst_limit: 1000s}
rules:
  - {budget: lookups, match: {table: t}}
`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := driver.NewPoolFromConfig(ctx, pc, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := admin.Exec(ctx, `select pg_stat_statements_reset()`); err != nil {
		t.Fatal(err)
	}
	pattern := func() driver.PatternStatus {
		ps, _ := lookupStatus(p.Snapshot())
		return ps
	}
	var wg sync.WaitGroup
	var stop atomic.Bool
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			for !stop.Load() {
				var v int
				if err := p.QueryRow(ctx, ssLookup, rand.IntN(1000)+1).Scan(&v); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// Until the pattern has been on the server's clock for two more reads.
	waitFor(t, 30*time.Second, "the lookups on the server's clock", func() (bool, string) {
		ps := pattern()
		return ps.Clock == driver.ClockServer, ps.Clock
	})
	time.Sleep(time.Second)
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a lookup failed: %v", err)
	}
	time.Sleep(time.Second) // the last lookups' report
	var debt float64
	for _, b := range p.Snapshot().Budgets {
		if b.Name == "lookups" {
			debt = b.Debt
		}
	}
	var calls int64
	var execMS float64
	if err := admin.QueryRow(ctx, `select coalesce(sum(calls), 0)::int8, coalesce(sum(total_exec_time), 0)
		from pg_stat_statements where dbid = $1 and toplevel and query = $2`, dbid, ssLookup).Scan(&calls, &execMS); err != nil {
		t.Fatal(err)
	}
	ps := pattern()
	server := execMS / 1e3
	t.Logf("%d lookups: the budget owes %.1f ms, the server spent %.1f ms (%.2f×); the client's mean less the round trip %.0f µs, the server's %.0f µs, round trip taken off %v",
		calls, debt*1e3, server*1e3, debt/server, ps.ClientMean*1e6, ps.ServerMean*1e6, p.Snapshot().Counters.NetworkFloor)
	if calls == 0 || server <= 0 {
		t.Fatalf("the server reports no lookups")
	}
	if r := debt / server; r < 0.5 || r > 2 {
		t.Errorf("the budget owes %.2f × what the server spent, want 0.5–2×", r)
	}
}
