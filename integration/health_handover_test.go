package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestHealthLeadCutFromDatabaseHandsOver: instance A (a pgx pool whose dialer the test can
// cut) is the elected health sampler; instance B (a database/sql connector) follows it. A's
// network to PostgreSQL is cut (new connections fail, its health backend is terminated),
// while B still reaches the healthy server and Redis. A lead that cannot read resigns rather than
// renew its lease and publish "not connected" (which B read as a stale sample, refusing every
// statement for as long as A lived): within ten intervals B holds the lease and admits.
func TestHealthLeadCutFromDatabaseHandsOver(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	const interval = 300 * time.Millisecond
	rules := fmt.Sprintf(`
coordination: {redis: %q, sync_interval: 200ms}
health_interval: %s
health_queries: {probe: "select 0"}
budgets:
  - {name: guarded, mode: enforce, max_concurrent: 100, throttle_when: {custom.probe: 1}}
rules:
  - {budget: guarded, match: {app: guarded}}
`, srv.URL, interval)
	cfg, err := driver.ParseConfig([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	var cut atomic.Bool
	dialer := &net.Dialer{}
	pcfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if cut.Load() {
			return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("connect: network is unreachable")}
		}
		return dialer.DialContext(ctx, network, addr)
	}
	pa, err := driver.NewPoolFromConfig(context.Background(), pcfg, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer pa.Close()
	ctx := tagging.With(context.Background(), "app", "guarded")
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	var leaseKey string
	waitFor(t, healthSettle, "A leads", func() (bool, string) {
		keys, _ := rc.Keys(context.Background(), "pgtraffic:{health:*}:sample").Result()
		return len(keys) > 0 && pa.Check(ctx) == nil, fmt.Sprint(keys)
	})
	leases, err := rc.Keys(context.Background(), "pgtraffic:{health:*}:lease").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range leases {
		if v, _ := rc.Get(context.Background(), k).Result(); v == pa.Snapshot().Budgets[0].Shared.Instance {
			leaseKey = k
		}
	}
	if leaseKey == "" {
		t.Fatal("A holds no health lease")
	}
	var logs lockedBuffer
	cb, _ := openShared(t, dsn, rules, &logs)
	waitFor(t, healthSettle, "B admits on A's sample", func() (bool, string) {
		err := cb.Check(ctx)
		return err == nil, fmt.Sprint(err)
	})

	cut.Store(true)
	if _, err := admin.Exec("select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'pgtraffic-health'"); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	var last error
	a := pa.Snapshot().Budgets[0].Shared.Instance
	recovered := eventually(10*interval+2*time.Second, func() bool {
		last = cb.Check(ctx)
		holder, _ := rc.Get(context.Background(), leaseKey).Result()
		return last == nil && holder != "" && holder != a
	})
	holder, _ := rc.Get(context.Background(), leaseKey).Result()
	t.Logf("%v after the cut: B's check %v; the lease is held by %q (A is %q)", time.Since(cutAt).Round(time.Millisecond), last,
		holder, a)
	if !recovered {
		t.Errorf("%v after the elected sampler A lost the database, B (which reaches a healthy server) checks %v and the lease is A's: %v",
			time.Since(cutAt).Round(time.Millisecond), last, holder == a)
	}
}
