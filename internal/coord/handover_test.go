package coord

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// ownedLocal is a fakeLocal that, as a budget.Budget does, stays shared when the registration
// that no longer shares it is not the one that shared it last (a coordinator that replaced
// another at a reload registered it since).
type ownedLocal struct {
	*fakeLocal
	mu    sync.Mutex
	owner any
}

func (o *ownedLocal) SetShared(now time.Time, owner any, kick func(), retry time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if kick == nil && o.owner != owner {
		return
	}
	o.owner = owner
	o.fakeLocal.SetShared(now, owner, kick, retry)
}

// switchable fails every script call while off is set, as a Redis that does not answer.
type switchable struct {
	*redis.Client
	off atomic.Bool
}

var errUnanswered = errors.New("i/o timeout (the test's Redis does not answer)")

func (s *switchable) script(ctx context.Context, run func() *redis.Cmd) *redis.Cmd {
	if s.off.Load() {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(errUnanswered)
		return cmd
	}
	return run()
}

func (s *switchable) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return s.script(ctx, func() *redis.Cmd { return s.Client.EvalSha(ctx, sha, keys, args...) })
}

func (s *switchable) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return s.script(ctx, func() *redis.Cmd { return s.Client.Eval(ctx, script, keys, args...) })
}

// TestCloseIntoKeepsWhatTheInstanceHeld: instance a shares a budget of 10 slots with b; a
// reload replaces a's coordinator (CloseInto, same id). The new coordinator's first sync
// fails: a keeps the lease it held, as after any failed sync, not the provisional lease of an
// instance that never synced. Once Redis answers, a's entry is its own (no second entry of a
// name that left), the fleet sees two instances, and the leases of a and b never sum above 10.
func TestCloseIntoKeepsWhatTheInstanceHeld(t *testing.T) {
	rc := newClient(t, redistest.Need(t))
	spec := Spec{Name: "handover", MaxConcurrent: 10}
	la := &ownedLocal{fakeLocal: newFakeLocal(0, 6)}
	lb := newFakeLocal(0, 3)
	a := newCoord(t, Options{Client: rc, Interval: time.Minute, Instance: "a", Logger: quiet})
	b := newCoord(t, Options{Client: rc, Interval: time.Minute, Instance: "b", Logger: quiet})
	a.Register(spec, la)
	b.Register(spec, lb)
	check := func(when string) {
		t.Helper()
		if sa, sb := la.lease("").Slots, lb.lease("").Slots; sa+sb > spec.MaxConcurrent {
			t.Fatalf("%s: a holds %d slots and b %d, above max_concurrent %d", when, sa, sb, spec.MaxConcurrent)
		}
	}
	for range 3 {
		mustSync(t, a)
		check("settling")
		mustSync(t, b)
		check("settling")
	}
	held := la.lease("").Slots
	if held < 6 {
		t.Fatalf("a holds %d slots, want at least the 6 it wants", held)
	}

	sw := &switchable{Client: rc}
	sw.off.Store(true)
	a2 := newCoord(t, Options{Client: sw, Interval: 30 * time.Second, Instance: a.Instance(), Logger: quiet})
	a2.Register(spec, la)
	if err := a.CloseInto(context.Background(), a2); err != nil {
		t.Fatal(err)
	}
	if err := a2.Sync(context.Background()); !errors.Is(err, errUnanswered) {
		t.Fatalf("a2's first sync: %v, want it to fail", err)
	}
	if got := la.lease(""); got.Slots != held {
		t.Fatalf("after the reload's first sync failed, a holds %+v, want the %d slots it held", got, held)
	}
	sw.off.Store(false)
	for range 3 {
		mustSync(t, a2)
		check("after the reload")
		mustSync(t, b)
		check("after the reload")
	}
	if got := la.lease("").Slots; got < 6 {
		t.Errorf("after the reload a holds %d slots, want at least the 6 it wants", got)
	}
	if st := a2.Status(); len(st) != 1 || st[0].Instances != 2 {
		t.Errorf("after the reload a sees %+v, want 2 instances (one entry per instance in Redis)", st)
	}
}

// tardyClient holds its next script call, once armed, for hold before Redis runs it, whatever
// the call's context says (a call written to a socket whose sender gave up on it); ran is
// closed once Redis answered it.
type tardyClient struct {
	*redis.Client
	armed atomic.Bool
	hold  time.Duration
	ran   chan struct{}
}

func (h *tardyClient) call(ctx context.Context, run func(context.Context) *redis.Cmd) *redis.Cmd {
	if h.armed.CompareAndSwap(true, false) {
		defer close(h.ran)
		time.Sleep(h.hold)
		return run(context.Background())
	}
	return run(ctx)
}

func (h *tardyClient) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return h.call(ctx, func(ctx context.Context) *redis.Cmd { return h.Client.EvalSha(ctx, sha, keys, args...) })
}

func (h *tardyClient) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return h.call(ctx, func(ctx context.Context) *redis.Cmd { return h.Client.Eval(ctx, script, keys, args...) })
}

// TestLateGoodbyeLeavesTheSuccessorsEntry: a reload removes a shared budget, and the goodbye of
// the coordinator it replaced (under the instance's id) gives up in the client but reaches
// Redis late; meanwhile another reload shares the budget again, under the same id, and its
// coordinator syncs it (granted the whole budget, alone). The late goodbye must not mark the
// instance as gone: it still holds those slots, and another instance joining must be granted
// none of them.
func TestLateGoodbyeLeavesTheSuccessorsEntry(t *testing.T) {
	rc := newClient(t, redistest.Need(t))
	spec := Spec{Name: "lategoodbye", MaxConcurrent: 4}
	tardy := &tardyClient{Client: rc, hold: 400 * time.Millisecond, ran: make(chan struct{})}
	c0 := newCoord(t, Options{Client: tardy, Interval: time.Minute, Instance: "x", Logger: quiet})
	l0 := newFakeLocal(0, 1)
	c0.Register(spec, l0)
	mustSync(t, c0)
	mustSync(t, c0) // a few reports: the goodbye's number is not the first

	// Reload 1: the budget is no longer shared; the goodbye gives up before Redis runs it.
	c1 := newCoord(t, Options{Client: rc, Interval: time.Minute, Instance: "x", Logger: quiet})
	tardy.armed.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	err := c0.CloseInto(ctx, c1)
	cancel()
	if err == nil {
		t.Fatal("the held goodbye returned in time: the scenario needs one that gives up")
	}
	// Reload 2: shared again, under the same id.
	c2 := newCoord(t, Options{Client: rc, Interval: time.Minute, Instance: "x", Logger: quiet})
	l2 := newFakeLocal(0, 1)
	c2.Register(spec, l2)
	if err := c1.CloseInto(context.Background(), c2); err != nil {
		t.Fatal(err)
	}
	mustSync(t, c2)
	if got := l2.lease("").Slots; got != 4 {
		t.Fatalf("alone, x is granted %d slots, want 4", got)
	}
	select {
	case <-tardy.ran:
	case <-time.After(10 * time.Second):
		t.Fatal("the held goodbye never reached Redis")
	}

	ly := newFakeLocal(0, 1)
	y := newCoord(t, Options{Client: rc, Interval: time.Minute, Instance: "y", Logger: quiet})
	y.Register(spec, ly)
	mustSync(t, y)
	if got, x := ly.lease("").Slots, l2.lease("").Slots; got+x > spec.MaxConcurrent {
		t.Fatalf("y joining is granted %d slots while x holds %d, above max_concurrent %d: the late goodbye marked x gone",
			got, x, spec.MaxConcurrent)
	}
}
