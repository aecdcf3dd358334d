package coord

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// blockingHandler is an application's log handler that blocks on the record it is told to,
// until released.
type blockingHandler struct {
	on      string
	entered chan struct{}
	release chan struct{}
}

func (h blockingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h blockingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h blockingHandler) WithGroup(string) slog.Handler            { return h }
func (h blockingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.on) {
		select {
		case h.entered <- struct{}{}:
		default:
		}
		<-h.release
	}
	return nil
}

// TestOutageLoggedWithoutTheLock: the log handler is the application's code. While it writes
// that Redis is unreachable (a handler shipping its records over the network may take long), the
// coordinator's state stays readable (Status, which the metrics callback reads) and its other
// work goes on: it is not logged under the coordinator's lock.
func TestOutageLoggedWithoutTheLock(t *testing.T) {
	h := blockingHandler{on: "Redis unreachable", entered: make(chan struct{}, 1), release: make(chan struct{})}
	hr := hangingRedis{begun: make(chan struct{}, 16)}
	rc := redis.NewClient(&redis.Options{Addr: "redis.invalid:6379", ContextTimeoutEnabled: true, MaxRetries: -1})
	rc.AddHook(hr)
	t.Cleanup(func() { rc.Close() })
	c := newCoord(t, Options{Client: rc, Interval: 400 * time.Millisecond, Logger: slog.New(h)})
	c.Register(Spec{Name: "b", Rate: 10, Burst: 10, MaxConcurrent: 4}, newFakeLocal(5, 2))
	synced := make(chan error, 1)
	go func() { synced <- c.Sync(context.Background()) }() // past its deadline: the outage
	select {
	case <-h.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the outage was never logged")
	}
	status := make(chan []Status, 1)
	go func() { status <- c.Status() }()
	select {
	case st := <-status:
		if len(st) != 1 || st[0].Failures != 1 {
			t.Errorf("status %+v, want the one budget with its failed sync", st)
		}
	case <-time.After(10 * time.Second):
		t.Error("Status waited for the application's log handler")
	}
	close(h.release)
	if err := <-synced; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Sync past the call's deadline: %v", err)
	}
	closeNow(c)
}
