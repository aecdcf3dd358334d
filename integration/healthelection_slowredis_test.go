package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/delayproxy"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

func healthProbeDB(t *testing.T) (string, *sql.DB) {
	t.Helper()
	dsn := pgtest.Shared(t).CreateDatabase(t)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	if _, err := admin.Exec("create sequence health_probe"); err != nil {
		t.Fatal(err)
	}
	return dsn, admin
}

// samplersOver counts the instances that sampled during d, and the server's health queries.
func samplersOver(t *testing.T, admin *sql.DB, ins []*electedInstance, d time.Duration) (samplers int, queries int64, per []int64) {
	p0, l0 := probes(t, admin), samplingCounts(t, ins)
	time.Sleep(d)
	p1, l1 := probes(t, admin), samplingCounts(t, ins)
	per = make([]int64, len(ins))
	for i := range l1 {
		per[i] = l1[i] - l0[i]
		if per[i] > 0 {
			samplers++
		}
	}
	return samplers, p1 - p0, per
}

// TestHealthElectionHungRedisDelaysNoStatement: three instances share a health sampler and a
// shared budget through Redis, which hangs (SIGSTOP) for six intervals. No application
// statement waits on Redis or is refused as stale health; the followers sample the database
// themselves within three intervals (counted on the server); once Redis resumes, one sampler
// again.
func TestHealthElectionHungRedisDelaysNoStatement(t *testing.T) {
	srv := redistest.Need(t)
	dsn, admin := healthProbeDB(t)
	ins := openElected(t, srv, dsn, fmt.Sprintf(`
coordination: {sync_interval: 200ms}
health_interval: %s
health_queries: {probe: "select 0 * nextval('health_probe')"}
budgets:
  - {name: guarded, mode: enforce, max_concurrent: 16, throttle_when: {custom.probe: 1}}
rules:
  - {budget: guarded, match: {app: guarded}}
`, electionInterval), 3)
	ctx := tagging.With(context.Background(), "app", "guarded")
	waitFor(t, healthSettle, "one sampler, every instance admitting", func() (bool, string) {
		for _, in := range ins {
			if _, err := in.db.ExecContext(ctx, "select 1"); err != nil {
				return false, err.Error()
			}
		}
		n, q, per := samplersOver(t, admin, ins, 5*electionInterval)
		return n == 1, fmt.Sprintf("%d samplers %v, %d queries", n, per, q)
	})
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			srv.Resume()
		}
	})
	paused := time.Now()
	before := samplingCounts(t, ins)
	var worst time.Duration
	var refused []string
	firstOwn := make([]time.Duration, len(ins))
	for time.Since(paused) < 6*electionInterval {
		for i, in := range ins {
			begun := time.Now()
			_, err := in.db.ExecContext(ctx, "select 1")
			worst = max(worst, time.Since(begun))
			if err != nil {
				var be *driver.BlockedError
				if !errors.As(err, &be) {
					t.Fatalf("instance %d: %v", i, err)
				}
				refused = append(refused, fmt.Sprintf("instance %d at %v: %v", i, time.Since(paused).Round(time.Millisecond), err))
			}
		}
		for i, n := range samplingCounts(t, ins) {
			if firstOwn[i] == 0 && n > before[i] {
				firstOwn[i] = time.Since(paused)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("Redis hung: slowest statement %v; first own sample per instance %v; %d refusals", worst, firstOwn, len(refused))
	if worst > electionInterval/2 {
		t.Errorf("while Redis hung, a statement took %v", worst)
	}
	if len(refused) > 0 {
		t.Errorf("while Redis hung, statements were refused: %v", refused)
	}
	for i, d := range firstOwn {
		if d == 0 || d > 3*electionInterval {
			t.Errorf("instance %d first sampled the database itself %v after Redis hung; want within three intervals (%v)", i, d, 3*electionInterval)
		}
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	waitFor(t, healthSettle, "one sampler again after Redis resumed", func() (bool, string) {
		n, q, per := samplersOver(t, admin, ins, 5*electionInterval)
		return n == 1, fmt.Sprintf("%d samplers %v, %d queries", n, per, q)
	})
}

// TestHealthElectionDistantRedisServerCount: three instances with their own go-redis clients
// (WithRedisClient, ContextTimeoutEnabled, as the driver asks) reach Redis through a proxy 200 ms
// away; health_interval 600 ms, so an election call may take 300 ms: one round trip on a warm
// connection fits, a new connection's HELLO and EVALSHA do not. Redis stalls once. Counted on
// the server: one instance runs the health query afterwards, as before the stall.
func TestHealthElectionDistantRedisServerCount(t *testing.T) {
	srv := redistest.Need(t)
	px := delayproxy.Start(t, srv.Addr, 0)
	dsn, admin := healthProbeDB(t)
	// openElected dials srv.Addr only: point it at the proxy.
	ins := openElected(t, &redistest.Server{Addr: px.Addr}, dsn, fmt.Sprintf(`
coordination: {sync_interval: 1s}
health_interval: %s
health_queries: {probe: "select 0 * nextval('health_probe')"}
budgets:
  - {name: guarded, mode: enforce, throttle_when: {custom.probe: 1}}
rules:
  - {budget: guarded, match: {app: guarded}}
`, electionInterval), 3)
	waitFor(t, healthSettle, "one sampler with Redis near", func() (bool, string) {
		n, q, per := samplersOver(t, admin, ins, 5*electionInterval)
		return n == 1, fmt.Sprintf("%d samplers %v, %d queries", n, per, q)
	})
	px.SetDelay(100 * time.Millisecond)
	waitFor(t, healthSettle, "one sampler with Redis 200 ms away on warm connections", func() (bool, string) {
		n, q, per := samplersOver(t, admin, ins, 5*electionInterval)
		return n == 1, fmt.Sprintf("%d samplers %v, %d queries", n, per, q)
	})
	px.SetDelay(2 * time.Second) // a stall: the calls on their way time out, their connections close
	time.Sleep(3 * electionInterval)
	px.SetDelay(100 * time.Millisecond)
	time.Sleep(2500 * time.Millisecond) // the stalled chunks drain
	start := time.Now()
	var last string
	for time.Since(start) < 20*electionInterval {
		n, q, per := samplersOver(t, admin, ins, 5*electionInterval)
		last = fmt.Sprintf("%d samplers %v, %d health queries on the server in 5 intervals", n, per, q)
		t.Logf("after the stall: %s", last)
		if n == 1 {
			return
		}
	}
	t.Errorf("Redis 200 ms away answered again, but 20 intervals later the instances still all sample the database: %s", last)
}
