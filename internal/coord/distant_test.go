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

// TestDistantRedisSyncsAfterFailure: a Redis 60 ms away (30 ms each way) with a sync_interval
// of 400 ms, so a sync's deadline is 100 ms: one call fits it on a warm connection, a new
// connection's handshake and the call (two round trips, three where Redis must be sent the
// script) do not. Redis then stalls for an interval (the proxy holds its replies): the calls
// time out and go-redis closes their connections. Once Redis answers again, every later call
// needs a new connection: with the same deadline after a failure, none would ever fit it and
// the budget would stay on its fallback share for good. A sync after a failed one has a longer
// deadline, so the instance syncs again within a few intervals, and back on a warm
// connection at the usual deadline.
func TestDistantRedisSyncsAfterFailure(t *testing.T) {
	srv := redistest.Need(t)
	px := delayproxy.Start(t, srv.Addr, 30*time.Millisecond)
	const interval = 400 * time.Millisecond
	c := newCoord(t, Options{URL: "redis://" + px.Addr + "/0", Interval: interval, Logger: quiet})
	c.Register(Spec{Name: "far", Rate: 1, Burst: 1, MaxConcurrent: 4}, newFakeLocal(1, 2))
	c.Start()
	t.Cleanup(func() { c.Close(context.Background()) })
	time.Sleep(5 * interval)
	first := c.Status()[0]
	px.SetDelay(time.Second) // Redis stalls: every call on its way times out
	time.Sleep(2 * interval)
	px.SetDelay(30 * time.Millisecond)
	time.Sleep(time.Second) // the stalled replies drain
	stalled := c.Status()[0]
	time.Sleep(10 * interval)
	after := c.Status()[0]
	t.Logf("at 60 ms: %d syncs in the first 5 intervals (latency %v); %d failures while stalled; in the 10 intervals after: %d syncs, %d failures, fallback %v, last sync %v ago",
		first.Syncs, first.Latency, stalled.Failures-first.Failures, after.Syncs-stalled.Syncs, after.Failures-stalled.Failures,
		after.Fallback, time.Since(after.LastSync).Round(time.Millisecond))
	if first.Syncs == 0 {
		t.Fatalf("no sync in 5 intervals with Redis 60 ms away and a 100 ms deadline: %+v", first)
	}
	if stalled.Failures == first.Failures {
		t.Fatalf("no sync failed while Redis stalled for two intervals: %+v", stalled)
	}
	// Whether the very last sync failed is left out: on a loaded machine one call of 60 ms can
	// miss its 100 ms deadline and put the budget on its fallback share until the next; the
	// defect this guards against synced never again.
	if after.Syncs-stalled.Syncs < 5 {
		t.Errorf("after Redis stalled once, 60 ms away with a 100 ms deadline: %d syncs in 10 intervals (%d failed), fallback %v",
			after.Syncs-stalled.Syncs, after.Failures-stalled.Failures, after.Fallback)
	}
}

// TestDistantRedisFirstCallSyncs: a fresh instance's first call runs on a new connection, its
// handshake and the script (EVALSHA, then EVAL when Redis does not have it yet) round trips of
// their own: 60 ms away at a sync_interval of 400 ms (a 100 ms deadline), two or three round
// trips do not fit the deadline of a call on a warm connection. The first sync has the longer
// deadline of a sync after a failure, so that an instance starting beside a distant Redis syncs
// from its first call rather than failing it, logging Redis unreachable and running on its
// fallback share until a retry. Three instances start one after the other: the first sends
// the script, the others find it in Redis's cache.
func TestDistantRedisFirstCallSyncs(t *testing.T) {
	srv := redistest.Need(t)
	px := delayproxy.Start(t, srv.Addr, 30*time.Millisecond)
	for i := range 3 {
		c := newCoord(t, Options{URL: "redis://" + px.Addr + "/0", Interval: 400 * time.Millisecond, Logger: quiet})
		c.Register(Spec{Name: "far", Rate: 1, Burst: 1, MaxConcurrent: 4}, newFakeLocal(1, 2))
		c.Start()
		var st Status
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if st = c.Status()[0]; st.Syncs > 0 || st.Failures > 0 {
				break
			}
		}
		c.Close(context.Background())
		if st.Syncs == 0 || st.Failures > 0 {
			t.Errorf("instance %d, Redis 60 ms away, a 100 ms deadline: %d syncs, %d failures by its first outcome; want its first call to sync",
				i, st.Syncs, st.Failures)
		}
	}
}
