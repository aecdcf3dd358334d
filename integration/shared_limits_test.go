package integration

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	goruntime "runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// activeOf counts the server's backends inside the pg_sleep of a statement whose text contains
// marker. Not state = 'active': a backend reports itself idle only after it has sent its
// result, so on a loaded machine it can still read 'active' while the statement admitted on the
// slot it freed already runs.
func activeOf(t *testing.T, admin *sql.DB, marker string) int {
	var n int
	if err := admin.QueryRow(`select count(*) from pg_stat_activity where wait_event = 'PgSleep' and query like '%' || $1 || '%' and query not like '%pg_stat_activity%'`, marker).Scan(&n); err != nil {
		t.Error(err)
	}
	return n
}

// fleetLoad runs workers on db sending q tagged app=fleet until ctx ends, counting results.
func fleetLoad(ctx context.Context, db *sql.DB, q string, workers int, ran, refused *atomic.Int64, errs chan<- error) *sync.WaitGroup {
	var wg sync.WaitGroup
	tagged := tagging.With(context.Background(), "app", "fleet")
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				_, err := db.ExecContext(tagged, q)
				switch {
				case err == nil:
					ran.Add(1)
				case errors.Is(err, driver.ErrBlocked):
					refused.Add(1)
					time.Sleep(5 * time.Millisecond)
				default:
					select {
					case errs <- err:
					default:
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
		}()
	}
	return &wg
}

// TestSharedLimitsDifferAfterHalfReload: three instances share max_concurrent
// 9; one of them reloads its rules with max_concurrent 3 (a change half rolled out). The
// package promises that instances that disagree share the smaller limit, and the CHANGELOG
// that "the status shows it". With every instance busy, the server never runs more than 3 of
// the budget's statements at once once the reload has settled, and the status of an instance
// that still has 9 says the limits differ.
func TestSharedLimitsDifferAfterHalfReload(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	rules := func(limit int) string {
		return fmt.Sprintf(`
coordination: {redis: %q, sync_interval: 200ms}
budgets:
  - {name: slots, mode: enforce, max_concurrent: %d}
rules:
  - {budget: slots, match: {app: fleet}}
`, srv.URL, limit)
	}
	var logs lockedBuffer
	var cs []*driver.Connector
	var dbs []*sql.DB
	for range 3 {
		c, db := openShared(t, dsn, rules(9), &logs)
		db.SetMaxOpenConns(8)
		cs, dbs = append(cs, c), append(dbs, db)
	}
	for i, c := range cs {
		if !eventually(5*time.Second, func() bool { return sharedStatus(t, c, "slots").Instances == 3 }) {
			t.Fatalf("instance %d: %+v", i, sharedStatus(t, c, "slots"))
		}
	}
	cfg, err := driver.ParseConfig([]byte(rules(3)))
	if err != nil {
		t.Fatal(err)
	}
	if err := cs[2].SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var ran, refused atomic.Int64
	errs := make(chan error, 1)
	var wgs []*sync.WaitGroup
	const q = "select pg_sleep(0.05), 'fleetlimit'"
	for _, db := range dbs {
		wgs = append(wgs, fleetLoad(ctx, db, q, 6, &ran, &refused, errs))
	}
	time.Sleep(3 * time.Second) // fifteen intervals to settle
	most, samples := 0, 0
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); samples++ {
		most = max(most, activeOf(t, admin, "fleetlimit"))
		time.Sleep(5 * time.Millisecond)
	}
	var page []byte
	page, _ = json.Marshal(cs[0].Snapshot())
	cancel()
	for _, wg := range wgs {
		wg.Wait()
	}
	select {
	case err := <-errs:
		t.Fatalf("error: %v", err)
	default:
	}
	t.Logf("%d samples of pg_stat_activity: at most %d of the budget's statements at once; %d ran, %d refused", samples, most, ran.Load(), refused.Load())
	if most > 3 {
		t.Errorf("the server ran %d statements of the budget at once; the smallest limit among the instances is 3", most)
	}
	if ran.Load() == 0 {
		t.Error("no statement ran")
	}
	// The status of an instance that still has 9 says the instances disagree, and what is in force.
	var snap struct {
		Budgets []struct {
			Name   string `json:"name"`
			Shared struct {
				LimitsDiffer  bool `json:"limits_differ"`
				LimitsInForce *struct {
					MaxConcurrent int `json:"max_concurrent"`
				} `json:"limits_in_force"`
			} `json:"shared"`
		} `json:"budgets"`
	}
	if err := json.Unmarshal(page, &snap); err != nil {
		t.Fatal(err)
	}
	if len(snap.Budgets) != 1 || !snap.Budgets[0].Shared.LimitsDiffer || snap.Budgets[0].Shared.LimitsInForce == nil ||
		snap.Budgets[0].Shared.LimitsInForce.MaxConcurrent != 3 {
		t.Errorf("instance 0 (max_concurrent 9) shares a budget whose limit in force is 3 (another instance's), yet its status does not say so:\n%s", page)
	}
}

// TestClosedInstancesLeaveNothingBehind: three instances with a shared budget (a
// quarantine beside it), a per-tenant shared budget and an elected health sampler run
// statements, then close. Afterwards every Redis key they wrote has an expiry and is gone
// within a few seconds, and the goroutines they started have returned.
func TestClosedInstancesLeaveNothingBehind(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	rules := fmt.Sprintf(`
coordination: {redis: %q, sync_interval: 100ms}
health_interval: 300ms
health_queries: {probe: "select 0"}
budgets:
  - {name: slots, mode: enforce, max_concurrent: 6, server_share: 0.5, max_duration: 150ms, quarantine: {after: 1, for: 2s}, throttle_when: {custom.probe: 1}}
  - {name: tenants, mode: enforce, per: tenant, max_concurrent: 4}
rules:
  - {budget: slots, match: {app: fleet}}
  - {budget: tenants, match: {app: tenant}}
`, srv.URL)
	// Warm up what the process keeps anyway (the shared server, pgx's and go-redis's pools).
	goruntime.GC()
	time.Sleep(200 * time.Millisecond)
	base := goruntime.NumGoroutine()
	var logs lockedBuffer
	var cs []*driver.Connector
	var dbs []*sql.DB
	for range 3 {
		cfg, err := driver.ParseConfig([]byte(rules))
		if err != nil {
			t.Fatal(err)
		}
		c, err := driver.NewConnector(dsn, driver.WithConfig(cfg), driver.WithLogger(logs.logger()))
		if err != nil {
			t.Fatal(err)
		}
		cs, dbs = append(cs, c), append(dbs, sql.OpenDB(c))
	}
	fleet := tagging.With(context.Background(), "app", "fleet")
	anyAdmitted := func(ctx context.Context, db *sql.DB, q string) error {
		var err error
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if _, err = db.ExecContext(ctx, q); !errors.Is(err, driver.ErrBlocked) {
				return err
			}
		}
		return err
	}
	for i, db := range dbs {
		if err := anyAdmitted(fleet, db, "select 1"); err != nil {
			t.Fatalf("instance %d: %v\n%s", i, err, logs.String())
		}
		for _, tenant := range []string{"a", "b", "c"} {
			if err := anyAdmitted(tagging.With(context.Background(), "app", "tenant", "tenant", tenant), db, "select 2"); err != nil {
				t.Fatalf("instance %d tenant %s: %v", i, tenant, err)
			}
		}
	}
	if err := anyAdmitted(fleet, dbs[0], "select pg_sleep(2)"); !errors.Is(err, driver.ErrOverrun) {
		t.Fatalf("want an overrun: %v", err)
	}
	time.Sleep(time.Second)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	before, _ := rc.Keys(context.Background(), "pgtraffic:*").Result()
	t.Logf("keys while running: %v", before)
	for _, db := range dbs {
		db.Close()
	}
	for _, c := range cs {
		c.Close()
	}
	// Every key has an expiry at once.
	keys, err := rc.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if ttl, err := rc.PTTL(context.Background(), k).Result(); err == nil && ttl == -1 {
			t.Errorf("key %q has no expiry after every instance closed (PTTL %v)", k, ttl)
		}
	}
	var left []string
	if !eventually(15*time.Second, func() bool {
		left, _ = rc.Keys(context.Background(), "*").Result()
		return len(left) == 0
	}) {
		t.Errorf("keys left 15s after every instance closed: %v", left)
	}
	var n int
	if !eventually(10*time.Second, func() bool { n = goruntime.NumGoroutine(); return n <= base+2 }) {
		buf := make([]byte, 1<<20)
		buf = buf[:goruntime.Stack(buf, true)]
		t.Errorf("%d goroutines 10s after every instance closed, %d before they opened:\n%s", n, base, buf)
	}
}
