package coord

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// These tests run coordinators against a real redis-server; several coordinators with
// distinct instance ids in one process stand for several application instances, each
// steering a simulated local budget.

// fakeLocal is a local budget that offers a fixed demand and records the leases it gets.
type fakeLocal struct {
	mu       sync.Mutex // protects the fields below
	keys     []string
	demand   float64 // offered execution seconds per second, per key
	wanted   int     // slots wanted, per key
	used     float64 // execution seconds to report as used at the next TakeUsage
	interval time.Duration
	last     time.Time
	leases   map[string]budget.Lease
}

func newFakeLocal(demand float64, wanted int, keys ...string) *fakeLocal {
	if len(keys) == 0 {
		keys = []string{""}
	}
	return &fakeLocal{keys: keys, demand: demand, wanted: wanted, interval: 100 * time.Millisecond, leases: map[string]budget.Lease{}}
}

func (f *fakeLocal) TakeUsage(now time.Time) []budget.Usage {
	f.mu.Lock()
	defer f.mu.Unlock()
	dt := f.interval
	if !f.last.IsZero() {
		dt = now.Sub(f.last)
	}
	f.last = now
	var out []budget.Usage
	for _, k := range f.keys {
		u := budget.Usage{Key: k, Offered: f.demand * dt.Seconds(), Used: f.used, Wanted: f.wanted, Starved: f.demand > 0}
		if active(&u) {
			out = append(out, u)
		}
	}
	f.used = 0
	return out
}

func (f *fakeLocal) SetLease(_ time.Time, key string, l budget.Lease) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leases[key] = l
}

func (f *fakeLocal) lease(key string) budget.Lease {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.leases[key]
}

func newClient(t *testing.T, srv *redistest.Server) *redis.Client {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { rc.Close() })
	return rc
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type instance struct {
	c     *Coordinator
	local *fakeLocal
}

func startInstances(t *testing.T, rc redis.UniversalClient, spec Spec, interval time.Duration, locals ...*fakeLocal) []instance {
	t.Helper()
	out := make([]instance, len(locals))
	for i, l := range locals {
		c := newCoord(t, Options{Client: rc, Interval: interval, Instance: fmt.Sprintf("i%02d", i), Logger: quiet})
		c.Register(spec, l)
		out[i] = instance{c, l}
	}
	return out
}

// sums adds up the leases the locals enforce now.
func sums(insts []instance, key string) (rate, burst float64, slots int) {
	for _, in := range insts {
		l := in.local.lease(key)
		rate += l.Rate
		burst += l.Burst
		slots += l.Slots
	}
	return
}

// mustSync syncs c, trying again when a call overran its deadline: a sync's deadline is a
// quarter interval, which a loaded machine running the race detector can overrun, and these
// tests are about what the syncs decide, not how fast they are. Any other error fails t.
func mustSync(t *testing.T, c *Coordinator) {
	t.Helper()
	var err error
	for range 5 {
		if err = c.Sync(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}

// syncRounds makes each instance sync in turn, rounds times, checking after every sync that
// the leases in force sum within the budget.
func syncRounds(t *testing.T, insts []instance, spec Spec, rounds int) {
	t.Helper()
	for r := 0; r < rounds; r++ {
		for i, in := range insts {
			mustSync(t, in.c)
			rate, burst, slots := sums(insts, "")
			if rate > spec.Rate*(1+1e-9) || burst > spec.Burst*(1+1e-9) || spec.MaxConcurrent > 0 && slots > spec.MaxConcurrent {
				t.Fatalf("round %d, after instance %d: leases sum to rate %v, burst %v, slots %d; budget %+v",
					r, i, rate, burst, slots, spec)
			}
		}
	}
}

func jain(xs []float64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	if s2 == 0 {
		return 0
	}
	return s * s / (float64(len(xs)) * s2)
}

func TestEqualDemandGetsEqualShares(t *testing.T) {
	rc := newClient(t, redistest.Need(t))
	spec := Spec{Name: "equal", Rate: 2, Burst: 4, MaxConcurrent: 4}
	locals := make([]*fakeLocal, 8)
	for i := range locals {
		locals[i] = newFakeLocal(10*spec.Rate, 4)
	}
	// A long interval keeps the odd slots from rotating during the test.
	insts := startInstances(t, rc, spec, time.Minute, locals...)
	syncRounds(t, insts, spec, 4)

	rates := make([]float64, len(insts))
	for i, in := range insts {
		rates[i] = in.local.lease("").Rate
	}
	if j := jain(rates); j < 0.95 {
		t.Fatalf("equal demand: Jain's index %.3f < 0.95 over rates %v", j, rates)
	}
	rate, burst, slots := sums(insts, "")
	// In their first interval the instances hold at most the burst over the instances
	// assumed before any were seen, each.
	wantBurst := min(spec.Burst, float64(len(insts))*spec.Burst/rules.DefaultFallbackInstances)
	if rate < 0.99*spec.Rate || burst < 0.99*wantBurst || slots != spec.MaxConcurrent {
		t.Fatalf("saturating demand leaves capacity unleased: rate %v, burst %v, slots %d of %+v", rate, burst, slots, spec)
	}
	st := insts[0].c.Status()
	if len(st) != 1 || st[0].Instances != 8 || st[0].Fallback || st[0].Syncs == 0 {
		t.Fatalf("status: %+v", st)
	}
}

func TestUnequalDemandDoesNotStarve(t *testing.T) {
	for _, tc := range []struct {
		name             string
		big, small       float64 // offered, in units of the budget's rate
		wantSmallAtLeast float64 // fraction of the rate
	}{
		{"10:1, both above the fair share", 10, 1, 0.45},
		{"small below the fair share gets its demand", 10, 0.1, 0.1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := newClient(t, redistest.Need(t))
			spec := Spec{Name: "unequal", Rate: 1, Burst: 1, MaxConcurrent: 10}
			big, small := newFakeLocal(tc.big*spec.Rate, 10), newFakeLocal(tc.small*spec.Rate, 1)
			insts := startInstances(t, rc, spec, time.Second, big, small)
			syncRounds(t, insts, spec, 4)
			if got := small.lease("").Rate; got < tc.wantSmallAtLeast*spec.Rate*(1-1e-9) {
				t.Fatalf("small instance: rate %v, want at least %v (big has %v)", got, tc.wantSmallAtLeast, big.lease("").Rate)
			}
			if s := small.lease("").Slots; s < 1 {
				t.Fatalf("small instance wants a slot and has %d", s)
			}
			if b := big.lease("").Slots; b != spec.MaxConcurrent-1 {
				t.Fatalf("big instance: %d slots, want the %d the small one does not want", b, spec.MaxConcurrent-1)
			}
		})
	}
}

func TestPartitionsAreIndependent(t *testing.T) {
	rc := newClient(t, redistest.Need(t))
	spec := Spec{Name: "tenants", Rate: 1, Burst: 1, MaxConcurrent: 2}
	a, b := newFakeLocal(10, 2, "acme", "globex"), newFakeLocal(10, 2, "acme")
	insts := startInstances(t, rc, spec, time.Second, a, b)
	ctx := context.Background()
	for range 3 {
		for _, in := range insts {
			mustSync(t, in.c)
		}
	}
	if g := a.lease("globex"); !near(g.Rate, 1) || g.Slots != 2 {
		t.Fatalf("alone in its partition, a has %+v of globex, want all of it", g)
	}
	if x, y := a.lease("acme"), b.lease("acme"); !near(x.Rate+y.Rate, 1) || x.Slots+y.Slots != 2 || !near(x.Rate, y.Rate) {
		t.Fatalf("acme shared: %+v and %+v", x, y)
	}
	n, err := rc.Exists(ctx, PartitionKey("tenants", "acme"), PartitionKey("tenants", "globex")).Result()
	if err != nil || n != 2 {
		t.Fatalf("partition keys: %d, %v", n, err)
	}
	ttl, err := rc.PTTL(ctx, PartitionKey("tenants", "acme")).Result()
	if err != nil || ttl <= 0 || ttl > time.Hour {
		t.Fatalf("a partition key must expire: PTTL %v, %v", ttl, err)
	}
}

func TestStoppedInstanceLosesSlots(t *testing.T) {
	rc := newClient(t, redistest.Need(t))
	const interval = 100 * time.Millisecond
	spec := Spec{Name: "slots", MaxConcurrent: 4}
	a, b := newFakeLocal(0, 4), newFakeLocal(0, 4)
	insts := startInstances(t, rc, spec, interval, a, b)
	syncRounds(t, insts, spec, 3)
	if a.lease("").Slots != 2 || b.lease("").Slots != 2 {
		t.Fatalf("before: a %d, b %d slots, want 2 each", a.lease("").Slots, b.lease("").Slots)
	}
	// a wants 4 and holds 2: Redis tells it when b's lease lapses, so that it can sync then
	// (b took its 2 slots after a's last sync of the rounds: a syncs once more).
	mustSync(t, insts[0].c)
	insts[0].c.mu.Lock()
	retake := insts[0].c.budgets[spec.Name].core.parts[""].retake
	insts[0].c.mu.Unlock()
	if retake.IsZero() || time.Until(retake) > leaseDuration(interval) {
		t.Fatalf("a starved instance must learn when the other lease lapses: %v from now", time.Until(retake))
	}
	// b stops syncing (a crash). a keeps syncing: it gets b's slots once b's lease lapses,
	// a lease duration after b's last sync, and not before.
	stoppedAt := time.Now()
	ctx := context.Background()
	for {
		// A sync that misses its deadline on a loaded machine is retried at the next poll.
		_ = insts[0].c.Sync(ctx)
		got, elapsed := a.lease("").Slots, time.Since(stoppedAt)
		if got > 2 && elapsed < leaseDuration(interval) {
			t.Fatalf("a took b's slots %v after b stopped, before b's lease lapsed", elapsed)
		}
		if got == 4 {
			break
		}
		// Within a lease duration of b's last sync, and so of when it stopped; the margin
		// is for a's polling and the machine's load.
		if elapsed > leaseDuration(interval)+2*interval {
			t.Fatalf("a still has %d slots %v after b stopped", got, elapsed)
		}
		time.Sleep(interval / 4)
	}
}

func TestClosedInstanceGivesSlotsBackAtOnce(t *testing.T) {
	rc := newClient(t, redistest.Need(t))
	spec := Spec{Name: "leave", MaxConcurrent: 4}
	a, b := newFakeLocal(0, 4), newFakeLocal(0, 4)
	insts := startInstances(t, rc, spec, time.Minute, a, b)
	syncRounds(t, insts, spec, 2)
	if err := insts[1].c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	mustSync(t, insts[0].c)
	if got := a.lease("").Slots; got != 4 {
		t.Fatalf("after b closed: a has %d slots, want 4 without waiting for b's lease to lapse", got)
	}
}

func TestUsageCountsOncePerSequenceNumber(t *testing.T) {
	rc := newClient(t, redistest.Need(t))
	ctx := context.Background()
	spec := Spec{Name: "idem", Rate: 1, Burst: 1}
	p := &part{key: ""}
	send := func(seq uint64, used float64) float64 {
		t.Helper()
		rep, err := runSync(ctx, rc, "inst", time.Minute, call{spec: spec, reps: []report{{p: p, seq: seq, used: used, demand: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		return rep.results[0].debt
	}
	first := send(1, 100)
	if first < 99 || first > 100 {
		t.Fatalf("100 s used at 1 s/s: global debt %v, want about 100", first)
	}
	if again := send(1, 100); again > first {
		t.Fatalf("a repeated sequence number counted again: debt %v after %v", again, first)
	}
	if next := send(2, 100); next < first+99 {
		t.Fatalf("a new sequence number was not counted: debt %v after %v", next, first)
	}
}

func TestRedisPausedFallsBackAndRecovers(t *testing.T) {
	srv := redistest.Need(t)
	rc := newClient(t, srv)
	const interval = 100 * time.Millisecond
	spec := Spec{Name: "paused", Rate: 4, Burst: 4, MaxConcurrent: 8}
	a, b := newFakeLocal(40, 8), newFakeLocal(40, 8)
	insts := startInstances(t, rc, spec, interval, a, b)
	for _, in := range insts {
		in.c.Start()
		t.Cleanup(func() { in.c.Close(context.Background()) })
	}
	waitFor(t, "leases from Redis", func() bool {
		return near(a.lease("").Rate, 2) && near(b.lease("").Rate, 2)
	})

	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "fallback while Redis is paused", func() bool { return insts[0].c.Status()[0].Fallback })
	// Nothing a statement or the status page calls waits on the paused Redis.
	for range 100 {
		done := make(chan struct{})
		go func() {
			insts[0].c.Status()
			insts[0].c.entries()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Status blocked while Redis is paused")
		}
	}
	// The lapsed lease decays towards the budget over the 2 known instances: the same
	// even split here, never the whole budget.
	time.Sleep(leaseDuration(interval) + 2*interval)
	if l := a.lease(""); l.Rate > spec.Rate/2*(1+1e-9) || l.Slots > spec.MaxConcurrent/2 {
		t.Fatalf("in fallback, a enforces %+v, more than half the budget", l)
	}

	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	before := insts[0].c.Status()[0].Syncs
	waitFor(t, "recovery after Redis resumed", func() bool {
		s := insts[0].c.Status()[0]
		return !s.Fallback && s.Syncs > before
	})
	if rate, _, slots := sums(insts, ""); rate > spec.Rate*(1+1e-9) || slots > spec.MaxConcurrent {
		for i, in := range insts {
			t.Logf("instance %d: %+v %+v", i, in.local.lease(""), in.c.Status())
		}
		t.Fatalf("after recovery the leases sum to rate %v, slots %d", rate, slots)
	}
}

func TestRedisRestartLetsNoMoreThanTheBudgetThrough(t *testing.T) {
	srv := redistest.Need(t)
	rc := newClient(t, srv)
	const interval = 100 * time.Millisecond
	spec := Spec{Name: "restart", Rate: 4, Burst: 8, MaxConcurrent: 8}
	locals := make([]*fakeLocal, 4)
	for i := range locals {
		locals[i] = newFakeLocal(40, 8)
	}
	insts := startInstances(t, rc, spec, interval, locals...)
	for _, in := range insts {
		in.c.Start()
		t.Cleanup(func() { in.c.Close(context.Background()) })
	}
	waitFor(t, "even leases", func() bool {
		for _, in := range insts {
			if l := in.local.lease(""); !near(l.Rate, spec.Rate/4) || l.Slots != spec.MaxConcurrent/4 {
				return false
			}
		}
		return true
	})

	if err := srv.Restart(); err != nil { // kill -9, then start on the same port, empty
		t.Fatal(err)
	}
	// Watch the leases in force for a few intervals: with equal demand every instance keeps
	// its even share, so the sum never exceeds the budget, not even by one burst.
	var maxRate, maxBurst float64
	maxSlots := 0
	for end := time.Now().Add(10 * interval); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		rate, burst, slots := sums(insts, "")
		maxRate, maxBurst, maxSlots = max(maxRate, rate), max(maxBurst, burst), max(maxSlots, slots)
	}
	if maxRate > spec.Rate*(1+1e-9) || maxBurst > spec.Burst*(1+1e-9) || maxSlots > spec.MaxConcurrent {
		t.Fatalf("around the restart the leases summed to rate %v, burst %v, slots %d; budget %+v",
			maxRate, maxBurst, maxSlots, spec)
	}
	n, err := rc.Exists(context.Background(), PartitionKey("restart", "")).Result()
	if err != nil || n != 1 {
		t.Fatalf("the restarted Redis was not resynced: %d, %v", n, err)
	}
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestLateCallChangesNothing(t *testing.T) {
	rc := newClient(t, redistest.Need(t))
	ctx := context.Background()
	spec := Spec{Name: "late", Rate: 1, Burst: 1, MaxConcurrent: 2}
	p := &part{key: ""}
	// A call whose deadline, in Redis time, passed long ago: it sat in a hung Redis.
	rep, err := runSync(ctx, rc, "inst", time.Second, call{spec: spec, notAfter: 1, reps: []report{{p: p, seq: 1, used: 5, demand: 1, want: 2}}})
	if !errors.Is(err, errStale) || rep.now <= 1 {
		t.Fatalf("late call: %+v, %v; want errStale with Redis's time", rep, err)
	}
	if n, err := rc.Exists(ctx, PartitionKey("late", "")).Result(); err != nil || n != 0 {
		t.Fatalf("a late call wrote the partition: %d, %v", n, err)
	}
	// One within its deadline acts.
	notAfter := rep.now + time.Second.Microseconds()
	if _, err := runSync(ctx, rc, "inst", time.Second, call{spec: spec, notAfter: notAfter, reps: []report{{p: p, seq: 1, used: 5, demand: 1, want: 2}}}); err != nil {
		t.Fatal(err)
	}
	if n, err := rc.Exists(ctx, PartitionKey("late", "")).Result(); err != nil || n != 1 {
		t.Fatalf("a timely call did not write the partition: %d, %v", n, err)
	}
}

func TestKickSyncsANewPartitionEarly(t *testing.T) {
	rc := newClient(t, redistest.Need(t))
	spec := Spec{Name: "kick", Rate: 1, Burst: 1, MaxConcurrent: 2}
	local := newFakeLocal(1, 1, "first")
	// A regular sync every minute: only a kick can bring the new partition's lease soon.
	c := newCoord(t, Options{Client: rc, Interval: time.Minute, Logger: quiet})
	h := c.Register(spec, local)
	c.Start()
	t.Cleanup(func() { c.Close(context.Background()) })
	waitFor(t, "the first lease", func() bool { return local.lease("first").Slots > 0 })

	local.mu.Lock()
	local.keys = append(local.keys, "second")
	local.mu.Unlock()
	h.Kick()
	waitFor(t, "the new partition's lease after a kick", func() bool { return local.lease("second").Slots > 0 })
}

func TestUnreachableAtStart(t *testing.T) {
	// Nothing listens on the port of a stopped server.
	srv := redistest.Need(t)
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "hunter2", ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { rc.Close() })
	var logged syncBuffer
	spec := Spec{Name: "down", Rate: 10, Burst: 10, MaxConcurrent: 20}
	local := newFakeLocal(5, 5)
	c := newCoord(t, Options{Client: rc, Interval: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	c.Register(spec, local)
	c.Start()
	t.Cleanup(func() { c.Close(context.Background()) })

	// The budget over rules.DefaultFallbackInstances, never the whole budget, and no burst room
	// before a first lease.
	want := budget.Lease{Rate: 1, Burst: 0, Slots: 2}
	waitFor(t, "the fallback lease", func() bool { return local.lease("") == want })
	waitFor(t, "a few failed syncs", func() bool { return c.Status()[0].Failures >= 3 })
	if st := c.Status()[0]; !st.Fallback || st.Syncs != 0 {
		t.Fatalf("status: %+v", st)
	}
	out := logged.String()
	if n := strings.Count(out, "Redis unreachable"); n != 1 {
		t.Fatalf("logged %d times, want once:\n%s", n, out)
	}
	if strings.Contains(out, "hunter2") {
		t.Fatalf("the log shows the password:\n%s", out)
	}
}

func TestManyPartitionsAndTheirKeysExpire(t *testing.T) {
	rc := newClient(t, redistest.Need(t))
	ctx := context.Background()
	keys := make([]string, 600) // more than one script call's worth
	for i := range keys {
		keys[i] = fmt.Sprintf("tenant-%d", i)
	}
	spec := Spec{Name: "many", Rate: 1, Burst: 1, MaxConcurrent: 2}
	local := newFakeLocal(1, 1, keys...)
	// Each call's deadline is a quarter interval: long enough for 256 partitions under the
	// race detector on a loaded machine, short enough for the keys to expire soon.
	c := newCoord(t, Options{Client: rc, Interval: 400 * time.Millisecond, Logger: quiet})
	c.Register(spec, local)
	mustSync(t, c)
	for _, k := range keys {
		// Alone, the instance holds every slot: its demand and the headroom.
		if l := local.lease(k); !near(l.Rate, 1) || l.Slots != spec.MaxConcurrent {
			t.Fatalf("partition %s: %+v", k, l)
		}
	}
	// The unkeyed partition is leased too, from the start.
	if n := rc.DBSize(ctx).Val(); n != int64(len(keys))+1 {
		t.Fatalf("%d keys for %d partitions and the unkeyed one", n, len(keys))
	}
	// The instance goes away without a word: every key expires on its own.
	waitFor(t, "the keys to expire", func() bool { return rc.DBSize(ctx).Val() == 0 })
}

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu sync.Mutex // protects b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestOddSlotsGoRound(t *testing.T) {
	// 4 slots, 8 instances wanting 4 each: whatever the rotation's turn, four instances hold
	// one slot each once the grants settled, and the ones holding them change only with the
	// turn.
	rc := newClient(t, redistest.Need(t))
	spec := Spec{Name: "odd", MaxConcurrent: 4}
	locals := make([]*fakeLocal, 8)
	for i := range locals {
		locals[i] = newFakeLocal(0, 4)
	}
	insts := startInstances(t, rc, spec, time.Minute, locals...)
	syncRounds(t, insts, spec, 3)
	holders := 0
	for _, l := range locals {
		switch l.lease("").Slots {
		case 0:
		case 1:
			holders++
		default:
			t.Fatalf("an instance holds %d of the odd slots", l.lease("").Slots)
		}
	}
	if holders != 4 {
		t.Fatalf("%d instances hold a slot, want 4", holders)
	}
}

func TestOddSlotsStayWhenAnInstanceLeaves(t *testing.T) {
	rc := newClient(t, redistest.Need(t))
	spec := Spec{Name: "odd", MaxConcurrent: 3}
	locals := make([]*fakeLocal, 5)
	for i := range locals {
		locals[i] = newFakeLocal(0, 2)
	}
	// A long interval keeps the odd slots from rotating during the test.
	insts := startInstances(t, rc, spec, time.Minute, locals...)
	syncRounds(t, insts, spec, 3)
	var holders, others []instance
	for _, in := range insts {
		if in.local.lease("").Slots == 1 {
			holders = append(holders, in)
		} else {
			others = append(others, in)
		}
	}
	if len(holders) != 3 {
		t.Fatalf("3 slots among 5 instances wanting 2 each: %d hold one", len(holders))
	}
	// One holder leaves: its slot goes to an instance that had none, and the other two
	// holders keep theirs (a handover would idle a slot until the holder's next sync).
	if err := holders[0].c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	rest := append(append([]instance{}, holders[1:]...), others...)
	syncRounds(t, rest, spec, 3)
	for i, in := range holders[1:] {
		if got := in.local.lease("").Slots; got != 1 {
			t.Fatalf("holder %d has %d slots after another left, want its 1 kept", i+1, got)
		}
	}
	if _, _, slots := sums(rest, ""); slots != 3 {
		t.Fatalf("after one left the others hold %d slots, want all 3", slots)
	}
}

// manyTenants is the active partitions of a `per: tenant` budget that one Redis serves.
const manyTenants = 100_000

// TestManyTenantsSyncWithinTheInterval syncs 100,000 active partitions of one budget against
// a healthy Redis: every sync succeeds (each script call has its own deadline; one deadline
// over all of them failed), the leases are set, Redis holds one small hash per partition,
// and the hashes expire once the instance is gone. The time each sync took is logged (and
// recorded in integration/PERFORMANCE.md), not asserted: it follows the machine's load.
func TestManyTenantsSyncWithinTheInterval(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("100,000 partitions: not under -short, nor under the race detector, which slows the client past a script call's deadline; the pass without it runs this test")
	}
	rc := newClient(t, redistest.Need(t))
	ctx := context.Background()
	keys := make([]string, manyTenants)
	for i := range keys {
		keys[i] = fmt.Sprintf("tenant-%d", i)
	}
	spec := Spec{Name: "tenants", Rate: 1, Burst: 1, MaxConcurrent: 2}
	local := newFakeLocal(1, 1, keys...)
	const interval = time.Second
	c := newCoord(t, Options{Client: rc, Interval: interval, Logger: quiet})
	c.Register(spec, local)
	for i := range 3 {
		start := time.Now()
		if err := c.Sync(ctx); err != nil {
			t.Fatalf("sync %d of %d partitions: %v", i, len(keys), err)
		}
		t.Logf("sync %d of %d partitions: %v", i, len(keys), time.Since(start))
	}
	if st := c.Status()[0]; st.Failures != 0 || st.Partitions != len(keys)+1 {
		t.Fatalf("status %+v", st)
	}
	for _, k := range keys {
		if l := local.lease(k); !near(l.Rate, 1) || l.Slots != spec.MaxConcurrent {
			t.Fatalf("partition %s: %+v", k, l)
		}
	}
	var used int64
	if info, err := rc.Info(ctx, "memory").Result(); err == nil {
		if i := strings.Index(info, "used_memory:"); i >= 0 {
			fmt.Sscanf(info[i:], "used_memory:%d", &used)
		}
	}
	n := rc.DBSize(ctx).Val()
	t.Logf("Redis: %d keys, %.1f MB used (%.0f bytes per partition)", n, float64(used)/1e6, float64(used)/float64(n))
	if n != int64(len(keys))+1 {
		t.Fatalf("%d keys for %d partitions and the unkeyed one", n, len(keys))
	}
	for _, k := range []string{keys[0], keys[len(keys)-1]} {
		ttl := rc.PTTL(ctx, PartitionKey(spec.Name, k)).Val()
		if ttl <= 0 || ttl > 2*leaseDuration(interval)+time.Second {
			t.Errorf("partition %s expires in %v, want within two lease durations", k, ttl)
		}
	}
}
