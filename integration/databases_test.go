package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// One process, several databases, one coordination Redis: what is shared through it (a
// budget's slots and rate, its quarantines, a health sample) is shared only between instances
// that reach the same database, as they name it.

func execEach(t *testing.T, dsn string, stmts ...string) {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// burstOn runs n statements at once on db and returns how many were admitted and the most that
// ran at once (measured from the budget's in-flight count).
func burstOn(t *testing.T, c *driver.Connector, db *sql.DB, ctx context.Context, n int, q string) (admitted, refused int, peak int) {
	t.Helper()
	var ok, no atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var most atomic.Int64
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, b := range c.Snapshot().Budgets {
				if b.Name == "reporting" && int64(b.InFlight) > most.Load() {
					most.Store(int64(b.InFlight))
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := db.ExecContext(ctx, q)
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, driver.ErrBlocked):
				no.Add(1)
			default:
				t.Errorf("%s: %v", q, err)
			}
		}()
	}
	wg.Wait()
	close(stop)
	return int(ok.Load()), int(no.Load()), int(most.Load())
}

// TestSharedBudgetIsPerDatabase: one process talks to two PostgreSQL clusters,
// each through its own connector with its own rules, both with a coordination section on the
// same Redis (the fleet's). Each has a budget named "reporting": 2 slots on the small cluster,
// 8 on the big one. The big cluster's statements must get its 8 slots whatever runs on the
// small cluster: they are different servers.
func TestSharedBudgetIsPerDatabase(t *testing.T) {
	t.Run("own limits", func(t *testing.T) { budgetOnTwoClusters(t, 2, 8, true) })
	t.Run("one rules file", func(t *testing.T) { budgetOnTwoClusters(t, 4, 4, true) })
	t.Run("one rules file without coordination", func(t *testing.T) { budgetOnTwoClusters(t, 4, 4, false) })
}

func budgetOnTwoClusters(t *testing.T, slotsA, slotsB int, coordinated bool) {
	rs := redistest.Need(t)
	dsnA := pgtest.Shared(t).CreateDatabase(t)
	dsnB := privateServer(t).CreateDatabase(t)
	coordination := fmt.Sprintf("coordination: {redis: %q, sync_interval: 200ms}", rs.URL)
	if !coordinated {
		coordination = ""
	}
	rulesFor := func(slots int) string {
		return fmt.Sprintf(`
%s
budgets:
  - {name: reporting, mode: enforce, max_concurrent: %d}
rules:
  - {budget: reporting, match: {app: reporting}}
`, coordination, slots)
	}
	ca, dbA := openRulesOn(t, dsnA, rulesFor(slotsA))
	cb, dbB := openRulesOn(t, dsnB, rulesFor(slotsB))
	ctx := tagging.With(context.Background(), "app", "reporting")

	// Control: B alone (A idle) runs 8 at once.
	time.Sleep(time.Second)
	adm0, ref0, peak0 := burstOn(t, cb, dbB, ctx, slotsB, "select pg_sleep(0.5)")
	t.Logf("B alone: admitted %d refused %d peak %d; B's shared status %+v", adm0, ref0, peak0, budgetStatus(t, cb, "reporting").Shared)

	// A holds its slots on its own cluster for 3 s.
	var wg sync.WaitGroup
	for i := 0; i < slotsA; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
				if _, err := dbA.ExecContext(ctx, "select pg_sleep(3)"); err == nil {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	mustEventually(t, "A's statements running", func() bool { return budgetStatus(t, ca, "reporting").InFlight == slotsA })
	time.Sleep(500 * time.Millisecond) // a couple of syncs
	adm, ref, peak := burstOn(t, cb, dbB, ctx, slotsB, "select pg_sleep(0.5)")
	var sb driver.SharedStatus
	if s := budgetStatus(t, cb, "reporting").Shared; s != nil {
		sb = *s
	}
	t.Logf("B while A busy on the other cluster: admitted %d refused %d peak %d; B's shared status %+v", adm, ref, peak, sb)
	wg.Wait()
	if ref > 0 || sb.Instances > 1 || sb.LimitsDiffer {
		t.Errorf("the budget \"reporting\" of cluster B (%d slots) was merged with cluster A's (%d slots) through Redis: "+
			"B admitted %d and refused %d of %d statements while A ran %d on its own cluster (A idle: %d admitted, %d refused), "+
			"instances %d, limits differ %v, in force %+v",
			slotsB, slotsA, adm, ref, slotsB, slotsA, adm0, ref0, sb.Instances, sb.LimitsDiffer, sb.LimitsInForce)
	}
}

// TestSharedQuarantineIsPerDatabase: two databases (one cluster), each with its own
// connector and rules sharing the fleet's Redis, a budget "reporting" on each with max_duration
// and a quarantine. "select count(*) from items" is slow on A (items is a view that sleeps) and
// instant on B (an empty table). A's overrun quarantines the pattern on A; B, where it takes a
// millisecond and never overran, must keep running it.
func TestSharedQuarantineIsPerDatabase(t *testing.T) {
	rs := redistest.Need(t)
	srv := pgtest.Shared(t)
	dsnA, dsnB := srv.CreateDatabase(t), srv.CreateDatabase(t)
	execEach(t, dsnA, "create view items as select x from generate_series(1, 3) x, lateral (select pg_sleep(0.5)) s")
	execEach(t, dsnB, "create table items (x int)")
	rules := fmt.Sprintf(`
coordination: {redis: %q, sync_interval: 200ms}
budgets:
  - name: reporting
    mode: enforce
    max_concurrent: 10
    max_duration: 300ms
    quarantine: {after: 1, for: 1m}
rules:
  - {budget: reporting, match: {app: reporting}}
`, rs.URL)
	ca, dbA := openRulesOn(t, dsnA, rules)
	cb, dbB := openRulesOn(t, dsnB, rules)
	ctx := tagging.With(context.Background(), "app", "reporting")
	const q = "select count(*) from items"

	// B runs it first (its first statements may wait for their first lease).
	for i := 0; i < 3; i++ {
		if !eventually(5*time.Second, func() bool { _, err := dbB.ExecContext(ctx, q); return err == nil }) {
			t.Fatal("B before: never admitted")
		}
	}
	// A overruns once: quarantined on A.
	var err error
	eventually(5*time.Second, func() bool {
		_, err = dbA.ExecContext(ctx, q)
		return !errors.Is(err, driver.ErrBlocked)
	})
	if !errors.Is(err, driver.ErrOverrun) {
		t.Fatalf("A: want an overrun, got %v", err)
	}
	if _, err := dbA.ExecContext(ctx, q); !errors.Is(err, driver.ErrBlocked) {
		t.Fatalf("A after its overrun: want quarantine, got %v", err)
	}
	// B: keeps running its 1 ms statement for 2 s (10 sync intervals).
	var ran, refused int
	var why string
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		_, err := dbB.ExecContext(ctx, q)
		if err == nil {
			ran++
		} else if be := (*driver.BlockedError)(nil); errors.As(err, &be) {
			refused++
			why = be.Error()
		} else {
			t.Fatalf("B: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("B: ran %d, refused %d (%s); B quarantines %+v; A quarantines %+v", ran, refused, why,
		cb.Snapshot().Quarantines, ca.Snapshot().Quarantines)
	if refused > 0 {
		t.Errorf("database B refused %d of %d runs of %q (1 ms there, never overran) because database A quarantined it: %s",
			refused, ran+refused, q, why)
	}
}

// TestHealthElectionPerSearchPath: one database, a schema per tenant, a connector per tenant
// whose DSN sets its search_path (as schema-per-tenant services do), one rules file with an
// unqualified custom health query ("select v from depth") and a coordination section. Each
// connector reads its own tenant's depth when it samples: tenant a's queue is deep (100),
// tenant b's empty (0). b must not be throttled by a's depth, nor a admitted on b's.
func TestHealthElectionPerSearchPath(t *testing.T) {
	t.Run("coordinated", func(t *testing.T) { healthPerSearchPath(t, true) })
	t.Run("alone", func(t *testing.T) { healthPerSearchPath(t, false) })
}

func healthPerSearchPath(t *testing.T, coordinated bool) {
	rs := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	execEach(t, dsn,
		"create schema a", "create schema b",
		"create table a.depth (v int)", "insert into a.depth values (100)",
		"create table b.depth (v int)", "insert into b.depth values (0)")
	withPath := func(schema string) string {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		return dsn + sep + "search_path=" + schema
	}
	coordination := fmt.Sprintf("coordination: {redis: %q, sync_interval: 200ms}", rs.URL)
	if !coordinated {
		coordination = ""
	}
	rules := fmt.Sprintf(`
%s
health_interval: 300ms
health_queries: {depth: "select v from depth"}
budgets:
  - {name: guarded, mode: enforce, shared: false, throttle_when: {custom.depth: 10}}
rules:
  - {budget: guarded, match: {app: guarded}}
`, coordination)
	ctx := tagging.With(context.Background(), "app", "guarded")
	ca, dbA := openRulesOn(t, withPath("a"), rules)
	cb, dbB := openRulesOn(t, withPath("b"), rules)
	// Each connector's statements see their own schema.
	for _, db := range []*sql.DB{dbA, dbB} {
		if _, err := db.Exec("select v from depth"); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2 * time.Second) // a few intervals: the election has settled
	var aAdmitted, bRefused, tries int
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); tries++ {
		if ca.Check(ctx) == nil {
			aAdmitted++
		}
		if cb.Check(ctx) != nil {
			bRefused++
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("over %d tries: tenant a (depth 100) admitted %d, tenant b (depth 0) refused %d", tries, aAdmitted, bRefused)
	if aAdmitted > 0 || bRefused > 0 {
		t.Errorf("health of one tenant's schema judged by the other's: tenant a (depth 100, threshold 10) admitted %d of %d "+
			"checks, tenant b (depth 0) refused %d of %d", aAdmitted, tries, bRefused, tries)
	}
}

// TestHealthElectionKeepsPrimaryAndStandbyApart: a service opens a primary connector and a
// read-replica connector on the same host list, told apart by target_session_attrs (primary /
// standby), as libpq and pgx let it; one rules file with a coordination section. A custom health
// query reads whether the server it runs on is in recovery (100 on the standby, 0 on the
// primary), threshold 10: the replica connector's budget must throttle, the primary's must not.
func TestHealthElectionKeepsPrimaryAndStandbyApart(t *testing.T) {
	t.Run("coordinated", func(t *testing.T) { healthPrimaryAndStandby(t, true) })
	t.Run("alone", func(t *testing.T) { healthPrimaryAndStandby(t, false) })
}

func healthPrimaryAndStandby(t *testing.T, coordinated bool) {
	rs := redistest.Need(t)
	primary := privateServer(t)
	standby, err := primary.StartStandby()
	if err != nil {
		t.Fatalf("StartStandby: %v", err)
	}
	t.Cleanup(func() { standby.Stop() })
	hosts := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable", primary.Port, standby.Port)
	coordination := fmt.Sprintf("coordination: {redis: %q, sync_interval: 200ms}", rs.URL)
	if !coordinated {
		coordination = ""
	}
	rules := fmt.Sprintf(`
%s
health_interval: 300ms
health_queries: {standby: "select case when pg_is_in_recovery() then 100 else 0 end"}
budgets:
  - {name: guarded, mode: enforce, shared: false, throttle_when: {custom.standby: 10}}
rules:
  - {budget: guarded, match: {app: guarded}}
`, coordination)
	fp := openPoolAt(t, hosts+"&target_session_attrs=primary", rules)
	fr := openPoolAt(t, hosts+"&target_session_attrs=standby", rules)
	// Sanity: each front end reaches the server it asked for.
	p, err := driver.NewPool(context.Background(), hosts+"&target_session_attrs=standby")
	if err != nil {
		t.Fatal(err)
	}
	var inRecovery bool
	if err := p.QueryRow(context.Background(), "select pg_is_in_recovery()").Scan(&inRecovery); err != nil || !inRecovery {
		t.Fatalf("target_session_attrs=standby reached a server in recovery %v (%v)", inRecovery, err)
	}
	p.Close()
	ctx := tagging.With(context.Background(), "app", "guarded")
	time.Sleep(2 * time.Second)
	var primaryRefused, replicaAdmitted, tries int
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); tries++ {
		if fp.Check(ctx) != nil {
			primaryRefused++
		}
		if fr.Check(ctx) == nil {
			replicaAdmitted++
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d tries: primary refused %d, replica admitted %d", tries, primaryRefused, replicaAdmitted)
	if primaryRefused > 0 || replicaAdmitted > 0 {
		t.Errorf("the primary's and the replica's health were confused: primary (value 0) refused %d of %d checks, "+
			"replica (value 100, threshold 10) admitted %d of %d", primaryRefused, tries, replicaAdmitted, tries)
	}
}

// TestHealthElectionReadsTheStandbysOwnLag: the same pair (a primary pool and a replica pool on
// one host list, target_session_attrs primary / standby), one rules file with a coordination
// section and throttle_when replication_lag: 1 on the batch budget. The primary's pool opens
// first (and is elected sampler). The standby is then cut off from its primary while the
// primary commits for 3 s: the replica pool's budget must refuse (as it does without Redis,
// TestHealthDisconnectedStandbyIsNotCaughtUp), since its server is seconds behind.
func TestHealthElectionReadsTheStandbysOwnLag(t *testing.T) {
	t.Run("coordinated", func(t *testing.T) { standbyLagElected(t, true) })
	t.Run("alone", func(t *testing.T) { standbyLagElected(t, false) })
}

func standbyLagElected(t *testing.T, coordinated bool) {
	rs := redistest.Need(t)
	primary := privateServer(t)
	standby, err := primary.StartStandby()
	if err != nil {
		t.Fatalf("StartStandby: %v", err)
	}
	t.Cleanup(func() { standby.Stop() })
	ctx := context.Background()
	pconn, err := pgx.Connect(ctx, primary.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pconn.Close(ctx)
	sconn, err := pgx.Connect(ctx, standby.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer sconn.Close(ctx)
	if _, err := pconn.Exec(ctx, "create table lag_probe (id bigserial primary key)"); err != nil {
		t.Fatal(err)
	}
	hosts := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable", primary.Port, standby.Port)
	coordination := fmt.Sprintf("coordination: {redis: %q, sync_interval: 200ms}", rs.URL)
	if !coordinated {
		coordination = ""
	}
	rules := fmt.Sprintf(`
%s
health_interval: 200ms
budgets:
  - {name: batch, mode: enforce, shared: false, throttle_when: {replication_lag: 1}}
rules:
  - {budget: batch, match: {job: import}}
`, coordination)
	fp := openPoolAt(t, hosts+"&target_session_attrs=primary", rules)
	batch := tagging.With(ctx, "job", "import")
	waitFor(t, healthSettle, "the primary's pool admits", func() (bool, string) { err := fp.Check(batch); return err == nil, fmt.Sprint(err) })
	time.Sleep(time.Second)
	fr := openPoolAt(t, hosts+"&target_session_attrs=standby", rules)
	waitFor(t, healthSettle, "the caught-up replica's pool admits", func() (bool, string) { err := fr.Check(batch); return err == nil, fmt.Sprint(err) })

	primaryRows, standbyRows, age := cutReplication(t, pconn, sconn)
	time.Sleep(600 * time.Millisecond)
	var admitted, tries int
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); tries++ {
		if fr.Check(batch) == nil {
			admitted++
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("primary %d rows, standby %d, last replay %.1fs ago: replica pool admitted %d of %d checks; "+
		"replica snapshot counters %+v", primaryRows, standbyRows, age, admitted, tries, fr.Snapshot().Counters)
	if admitted > 0 {
		t.Errorf("the replica's batch budget (replication_lag: 1) admitted %d of %d checks on a standby cut off for 3 s "+
			"(%d of %d rows, last replay %.1fs ago): it read the primary's lag through the election", admitted, tries,
			standbyRows, primaryRows, age)
	}
}

// TestDecisionsCountPerDatabase: two databases' connectors on one meter provider, each with a
// budget "reporting", which refuses everything on A (max_concurrent: 0) and admits on B.
// pgtraffic.decisions tells the two apart, by db.namespace and pgtraffic.connector, as the
// gauges do.
func TestDecisionsCountPerDatabase(t *testing.T) {
	srv := pgtest.Shared(t)
	dsnA, dsnB := srv.CreateDatabase(t), srv.CreateDatabase(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	rulesWith := func(slots int) *driver.Config {
		cfg, err := driver.ParseConfig([]byte(fmt.Sprintf(`
budgets:
  - {name: reporting, mode: enforce, max_concurrent: %d}
rules:
  - {budget: reporting, match: {app: reporting}}
`, slots)))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	open := func(dsn string, slots int) *sql.DB {
		c, err := driver.NewConnector(dsn, driver.WithConfig(rulesWith(slots)), driver.WithMeterProvider(mp))
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(c)
		t.Cleanup(func() { db.Close() })
		return db
	}
	dbA, dbB := open(dsnA, 0), open(dsnB, 4)
	ctx := tagging.With(context.Background(), "app", "reporting")
	for range 3 {
		if _, err := dbA.ExecContext(ctx, "select 1"); !errors.Is(err, driver.ErrBlocked) {
			t.Fatalf("A: %v, want a refusal", err)
		}
		if _, err := dbB.ExecContext(ctx, "select 1"); err != nil {
			t.Fatalf("B: %v", err)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{} // database/decision → count
	connectors := map[string]string{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != "pgtraffic.decisions" || !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				ns, _ := dp.Attributes.Value("db.namespace")
				d, _ := dp.Attributes.Value("pgtraffic.decision")
				conn, _ := dp.Attributes.Value("pgtraffic.connector")
				counts[ns.AsString()+"/"+d.AsString()] += dp.Value
				connectors[ns.AsString()] = conn.String()
			}
		}
	}
	nameA, nameB := databaseName(t, dsnA), databaseName(t, dsnB)
	if counts[nameA+"/block"] != 3 || counts[nameB+"/allow"] != 3 || counts[nameA+"/allow"] != 0 || counts[nameB+"/block"] != 0 ||
		connectors[nameA] == connectors[nameB] {
		t.Errorf("pgtraffic.decisions by database and decision %v, connectors %v; want 3 blocks on %s, 3 allows on %s, "+
			"each under its own connector", counts, connectors, nameA, nameB)
	}
}

// databaseName is the name of dsn's database.
func databaseName(t *testing.T, dsn string) string {
	t.Helper()
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return cc.Database
}
