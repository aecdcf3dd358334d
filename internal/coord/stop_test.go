package coord

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// hangingRedis is a Redis that never answers: each command waits until its context ends and
// fails with the context's error, and begun receives a value as it starts (when there is room).
// Nothing is dialled.
type hangingRedis struct{ begun chan struct{} }

func (h hangingRedis) DialHook(redis.DialHook) redis.DialHook {
	return func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("no Redis in this test")
	}
}

func (h hangingRedis) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, _ redis.Cmder) error {
		select {
		case h.begun <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return ctx.Err()
	}
}

func (h hangingRedis) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// newHanging returns a coordinator on a hangingRedis, logging to the returned buffer, and the
// hook's channel.
func newHanging(t *testing.T, interval time.Duration) (*Coordinator, *syncBuffer, chan struct{}) {
	t.Helper()
	h := hangingRedis{begun: make(chan struct{}, 16)}
	rc := redis.NewClient(&redis.Options{Addr: "redis.invalid:6379", ContextTimeoutEnabled: true, MaxRetries: -1})
	rc.AddHook(h)
	t.Cleanup(func() { rc.Close() })
	var logged syncBuffer
	c := newCoord(t, Options{Client: rc, Interval: interval, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	return c, &logged, h.begun
}

// closeNow closes c without waiting on Redis for the leave calls: it returns once every loop,
// a stopped budget's included, has ended.
func closeNow(c *Coordinator) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = c.Close(ctx) // the leave calls fail with ctx: nothing to check
}

// noFailure fails the test when the budget of h counted a failed sync or is on its fallback
// share.
func noFailure(t *testing.T, h *Handle) {
	t.Helper()
	h.c.mu.Lock()
	failures, failing := h.e.core.failures, h.e.core.failing
	h.c.mu.Unlock()
	if failures != 0 || failing {
		t.Errorf("%d failed syncs counted (fallback: %v), want none", failures, failing)
	}
}

// Stopping a budget's loop while its sync waits on Redis (the coordinator closed, as every
// rolling deploy does, or the registration closed or replaced by a reload) abandons the call,
// and that is no Redis outage: nothing is logged, no failure counted, no fallback share.
// Redis here never answers, and the calls' deadlines (15 s) are far off when they are stopped.
func TestStopMidSyncIsNoRedisFailure(t *testing.T) {
	spec := Spec{Name: "b", Rate: 10, Burst: 10, MaxConcurrent: 4}
	for _, tc := range []struct {
		name string
		// stop stops h's loop (or leaves it to Close), returning the registration that
		// replaces it, if any.
		stop func(c *Coordinator, h *Handle) *Handle
	}{
		{"Close", func(*Coordinator, *Handle) *Handle { return nil }},
		{"Register again", func(c *Coordinator, h *Handle) *Handle { return c.Register(spec, h.e.local) }},
		{"Handle.Close", func(_ *Coordinator, h *Handle) *Handle { h.Close(); return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, logged, begun := newHanging(t, time.Minute)
			h := c.Register(spec, newFakeLocal(5, 2, "t1", "t2"))
			c.Start()
			select {
			case <-begun:
			case <-time.After(30 * time.Second):
				t.Fatal("no sync began")
			}
			next := tc.stop(c, h)
			closeNow(c) // waits for the loops, the stopped one's included
			if out := logged.String(); strings.Contains(out, "unreachable") {
				t.Errorf("logged an outage:\n%s", out)
			}
			noFailure(t, h)
			if next != nil {
				noFailure(t, next)
			}
		})
	}
}

// A Sync whose caller gives up while its call waits for a turn among the calls on their way is
// no Redis failure either; a call past its own deadline is one, logged once.
func TestSyncGivenUpIsNoRedisFailure(t *testing.T) {
	c, logged, _ := newHanging(t, 400*time.Millisecond) // a deadline of minDeadline
	h := c.Register(Spec{Name: "b", Rate: 10, Burst: 10, MaxConcurrent: 4}, newFakeLocal(5, 2))
	for range maxCalls {
		c.sem <- struct{}{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Sync(ctx); !errors.Is(err, errNoTurn) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Sync with no turn and its ctx ended: %v", err)
	}
	if out := logged.String(); out != "" {
		t.Errorf("logged:\n%s", out)
	}
	noFailure(t, h)
	for range maxCalls {
		<-c.sem
	}

	if err := c.Sync(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Sync past the call's deadline: %v", err)
	}
	if n := strings.Count(logged.String(), "Redis unreachable"); n != 1 {
		t.Errorf("outage logged %d times, want once:\n%s", n, logged.String())
	}
	if st := c.Status()[0]; st.Failures != 1 || !st.Fallback {
		t.Errorf("status %+v, want one failure and the fallback share", st)
	}
}
