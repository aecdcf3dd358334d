package coord

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/delayproxy"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// TestDistantRedisSyncsAfterRestart: a Redis 90 ms away (a proxy delaying 45 ms each way)
// with the default sync_interval of 1s, so a sync's deadline is 250 ms: nearly three round
// trips. Redis restarts empty; every call after it runs on a new connection, which go-redis
// opens with a handshake inside the call's deadline, before EVALSHA (and, the script gone from
// Redis's cache, EVAL). The coordinator's client leaves out the handshake's optional round
// trips (CLIENT SETINFO, CLIENT MAINT_NOTIFICATIONS), so that the call fits its deadline and the
// instance syncs again, rather than starting over on a new connection every interval.
func TestDistantRedisSyncsAfterRestart(t *testing.T) {
	srv := redistest.Need(t)
	px := delayproxy.Start(t, srv.Addr, 0)
	const interval = time.Second
	c := newCoord(t, Options{URL: "redis://" + px.Addr + "/0", Interval: interval, Logger: quiet})
	c.Register(Spec{Name: "far", Rate: 1, Burst: 1, MaxConcurrent: 4}, newFakeLocal(1, 2))
	c.Start()
	t.Cleanup(func() { c.Close(context.Background()) })
	time.Sleep(2 * interval)
	px.SetDelay(45 * time.Millisecond)
	time.Sleep(3 * interval)
	before := c.Status()[0]
	if before.Fallback || before.Syncs == 0 {
		t.Fatalf("no sync 70 ms away on a warm connection: %+v", before)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * interval)
	after := c.Status()[0]
	t.Logf("before the restart: %d syncs (latency %v); in the 10 intervals after it: %d syncs, %d failures, fallback %v",
		before.Syncs, before.Latency, after.Syncs-before.Syncs, after.Failures-before.Failures, after.Fallback)
	if after.Syncs == before.Syncs || after.Fallback {
		t.Errorf("Redis restarted 90 ms away (a sync's deadline is 250 ms): no sync succeeded in 10 intervals (%d failed)",
			after.Failures-before.Failures)
	}
}
