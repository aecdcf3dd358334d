package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestHealthReplayedSampleNeverLiftsThrottle: a forged sample never lifts a limit; the README
// says that whoever can write the coordination Redis but cannot query the database cannot forge
// a sample that is read, "nor make an old one read as fresh". Three instances share
// a health sampler. A writer of Redis copies the signed sample while the database is healthy
// (custom.gate reads 0, the threshold is 5). The database then turns unhealthy (10): the lead
// reads it, publishes it, and every instance refuses the enforce budget's statements on that
// fresh reading. The writer now puts the copied (older, genuinely signed) sample back after each
// of the lead's publications: the followers must keep the newer reading they hold, and go on
// refusing while the database is unhealthy.
func TestHealthReplayedSampleNeverLiftsThrottle(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec("create table gate(v int); insert into gate values (0)"); err != nil {
		t.Fatal(err)
	}
	const interval = 1500 * time.Millisecond
	ins := openElected(t, srv, dsn, fmt.Sprintf(`
coordination: {sync_interval: 200ms}
health_interval: %s
health_queries: {gate: "select v from gate"}
budgets:
  - {name: guarded, mode: enforce, throttle_when: {custom.gate: 5}}
rules:
  - {budget: guarded, match: {app: guarded}}
`, interval), 3)
	ctx := tagging.With(context.Background(), "app", "guarded")
	waitFor(t, healthSettle, "every instance admits, two of them on a shared sample", func() (bool, string) {
		ok, followers := true, 0
		for _, in := range ins {
			ok = ok && in.c.Check(ctx) == nil
			if in.counter(t, "pgtraffic.health.shared_samples") > 0 {
				followers++
			}
		}
		return ok && followers == len(ins)-1, fmt.Sprint("followers ", followers)
	})

	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	bg := context.Background()
	sampleKey := electionKey(t, rc, ":sample")
	// Copy a sample right after the lead published it (healthy: the gate reads 0).
	first, err := rc.HGet(bg, sampleKey, "at").Result()
	if err != nil {
		t.Fatal(err)
	}
	var copied map[string]string
	waitFor(t, 3*interval, "a new publication", func() (bool, string) {
		m, err := rc.HGetAll(bg, sampleKey).Result()
		if err == nil && m["at"] != "" && m["at"] != first {
			copied = m
			return true, ""
		}
		return false, fmt.Sprint(m, err)
	})
	copiedAt := time.Now()
	if _, err := admin.Exec("update gate set v = 10"); err != nil {
		t.Fatal(err)
	}
	// Every instance refuses on a fresh reading of 10.
	waitFor(t, healthSettle, "every instance refuses on the unhealthy reading", func() (bool, string) {
		for i, in := range ins {
			err := in.c.Check(ctx)
			var be *driver.BlockedError
			if !errors.As(err, &be) || be.Reason != driver.ReasonHealth || !contains(be.Limit, "custom.gate=10") {
				return false, fmt.Sprintf("instance %d: %v", i, err)
			}
		}
		return true, ""
	})
	t.Logf("all refuse on custom.gate=10 %v after the copy", time.Since(copiedAt).Round(time.Millisecond))

	// Replay the copied sample until it is three intervals old; count the admissions.
	deadline := copiedAt.Add(3 * interval)
	if time.Until(deadline) < interval/2 {
		t.Fatalf("the instances took %v to refuse on the fresh reading; too little of the copied sample's three intervals is left to test", time.Since(copiedAt))
	}
	admitted, checks := 0, 0
	var when []string
	for time.Now().Before(deadline) {
		pipe := rc.TxPipeline()
		pipe.Del(bg, sampleKey)
		pipe.HSet(bg, sampleKey, "at", copied["at"], "data", copied["data"], "sig", copied["sig"])
		pipe.PExpire(bg, sampleKey, 10*interval)
		if _, err := pipe.Exec(bg); err != nil {
			t.Fatal(err)
		}
		for i, in := range ins {
			checks++
			if err := in.c.Check(ctx); err == nil {
				admitted++
				if len(when) < 5 {
					when = append(when, fmt.Sprintf("instance %d at %v", i, time.Since(copiedAt).Round(time.Millisecond)))
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("while the copied sample was replayed: %d of %d checks admitted (%v)", admitted, checks, when)
	if admitted > 0 {
		t.Errorf("a replayed, older sample lifted the throttle: %d of %d checks admitted while custom.gate read 10 "+
			"and every instance had read so (first: %v)", admitted, checks, when)
	}
}
