package coord

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// lateClient holds its next script call, once armed, for hold before Redis runs it, whatever
// the call's context says: a call already written to a connection whose sender stopped waiting
// for it (a client that does not abandon a command on its way). begun is closed as it is held.
type lateClient struct {
	*redis.Client
	armed atomic.Bool
	hold  time.Duration
	begun chan struct{}
}

func (l *lateClient) call(ctx context.Context, run func(context.Context) *redis.Cmd) *redis.Cmd {
	if l.armed.CompareAndSwap(true, false) {
		close(l.begun)
		time.Sleep(l.hold)
		return run(context.Background())
	}
	return run(ctx)
}

func (l *lateClient) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return l.call(ctx, func(ctx context.Context) *redis.Cmd { return l.Client.EvalSha(ctx, sha, keys, args...) })
}

func (l *lateClient) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return l.call(ctx, func(ctx context.Context) *redis.Cmd { return l.Client.Eval(ctx, script, keys, args...) })
}

// TestCloseSaysGoodbyeAfterItsCallsOnTheirWay: a coordinator whose sync call is still on its
// way when it closes (its loop gave up on the call, which then reaches Redis late) says goodbye
// only once that call has returned. Were the goodbye first, the late sync would mark the
// instance in Redis as holding its slots again until its lease lapsed, and another instance
// would be granted none of them meanwhile.
func TestCloseSaysGoodbyeAfterItsCallsOnTheirWay(t *testing.T) {
	rc := newClient(t, redistest.Need(t))
	spec := Spec{Name: "closeorder", MaxConcurrent: 4}
	late := &lateClient{Client: rc, hold: 300 * time.Millisecond, begun: make(chan struct{})}
	a := newCoord(t, Options{Client: late, Interval: time.Minute, Instance: "a", Logger: quiet})
	la := newFakeLocal(0, 4)
	a.Register(spec, la)
	mustSync(t, a)
	if got := la.lease("").Slots; got != 4 {
		t.Fatalf("a alone has %d slots, want 4", got)
	}

	late.armed.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	synced := make(chan error, 1)
	go func() { synced <- a.Sync(ctx) }()
	<-late.begun
	cancel() // as Close stops a loop: the sync returns, its call still on its way
	<-synced
	closeCtx, done := context.WithTimeout(context.Background(), 5*time.Second)
	defer done()
	began := time.Now()
	if err := a.Close(closeCtx); err != nil {
		t.Fatal(err)
	}
	t.Logf("Close took %v", time.Since(began))
	time.Sleep(late.hold) // the late call has reached Redis whatever Close did

	lb := newFakeLocal(0, 4)
	b := newCoord(t, Options{Client: rc, Interval: time.Minute, Instance: "b", Logger: quiet})
	b.Register(spec, lb)
	mustSync(t, b)
	if got := lb.lease("").Slots; got != 4 {
		t.Fatalf("after a closed, b alone was granted %d slots, want 4: a's late sync reached Redis after its goodbye", got)
	}
}
