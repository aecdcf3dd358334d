package coord

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// A simulation in virtual time of instances sharing a rate budget: each instance is a real
// Coordinator, its loop driven by the simulation rather than started, steering a real
// budget.Budget whose workers run statements back to back and try a refused one again
// after its RetryAfter (at least 20 ms, at most 200 ms), as the shared-budget experiment's
// processes do. Redis is a real redis-server running the real sync script with one line
// changed: Redis TIME is the simulation's clock. Nothing depends on the test machine's
// speed, so a run is the same every time (TestVirtualSimIsDeterministic) and its figures can
// be asserted.

// The line of sync.lua that reads Redis's clock, and what the simulation puts in its place:
// the clock passed after the script's own arguments.
const (
	redisTime   = "local t = redis.call('TIME')"
	virtualTime = "local t = {ARGV[#ARGV - 1], ARGV[#ARGV]}"
)

// The line of sync.lua that sets the expiry of a budget's hash of partitions, and what the
// simulation puts in its place: Redis expires keys on its own clock, which the simulation
// outruns, so the hash's expiry in virtual time (ms) goes to a key beside it, and a call
// deletes the keys that expired before it runs (as Redis does on access). A partition's own
// expiry is in its field, on the script's clock.
const (
	redisExpire   = "redis.call('PEXPIRE', hkey, keep_ms)"
	virtualExpire = "redis.call('SET', hkey .. ':vexp', math.max(tonumber(redis.call('GET', hkey .. ':vexp')) or 0, math.floor(now / 1000) + keep_ms))"
)

// clockedRedis is a client on which the sync script reads the simulation's clock for Redis
// TIME. While down, every call fails without running; while paused (pause), every call
// waits until resume, whatever its deadline, as on a stopped redis-server (SIGSTOP), and
// then runs, late. The simulation's goroutine sets its other fields only between calls.
type clockedRedis struct {
	*redis.Client
	script *redis.Script
	now    func() time.Time
	down   atomic.Bool // the sim loop sets it; an abandoned call reads it from its own goroutine
	lost   func() bool // whether the reply to a call that ran is lost; nil: none is
	// paused, while not nil, is closed by resume; the calls made meanwhile wait for it.
	paused atomic.Pointer[chan struct{}]
	// held, when not nil, runs in each call that pause holds, before it waits.
	held func()
	// before, when not nil, runs before each call that reaches Redis, at the call's time:
	// another writer, between the coordinators' calls.
	before func(ctx context.Context, now time.Time)
}

// pause makes every call wait until resume.
func (c *clockedRedis) pause() {
	ch := make(chan struct{})
	c.paused.Store(&ch)
}

// resume lets the calls held by pause run.
func (c *clockedRedis) resume() {
	if ch := c.paused.Swap(nil); ch != nil {
		close(*ch)
	}
}

func newClockedRedis(t *testing.T, rc *redis.Client, now func() time.Time) *clockedRedis {
	t.Helper()
	if strings.Count(syncSource, redisTime) != 1 {
		t.Fatalf("sync.lua no longer reads Redis TIME as %q", redisTime)
	}
	if strings.Count(syncSource, redisExpire) != 1 {
		t.Fatalf("sync.lua no longer expires a partition as %q", redisExpire)
	}
	src := strings.Replace(syncSource, redisTime, virtualTime, 1)
	src = strings.Replace(src, redisExpire, virtualExpire, 1)
	return &clockedRedis{Client: rc, script: redis.NewScript(src), now: now}
}

var errSimDown = errors.New("sim: Redis unreachable")

func (c *clockedRedis) run(ctx context.Context, keys []string, args []any) *redis.Cmd {
	if c.down.Load() {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(errSimDown)
		return cmd
	}
	if ch := c.paused.Load(); ch != nil {
		if c.held != nil {
			c.held()
		}
		<-*ch
	}
	now := c.now()
	if c.before != nil {
		c.before(ctx, now)
	}
	for _, key := range keys {
		if at, err := c.Get(ctx, key+":vexp").Int64(); err == nil && at <= now.UnixMilli() {
			c.Del(ctx, key, key+":vexp")
		}
	}
	args = append(slices.Clip(args), now.Unix(), now.Nanosecond()/1000)
	cmd := c.script.Run(ctx, c.Client, keys, args...)
	if c.lost != nil && c.lost() {
		cmd.SetErr(context.DeadlineExceeded) // Redis ran it; the caller gave up on the reply
	}
	return cmd
}

func (c *clockedRedis) EvalSha(ctx context.Context, _ string, keys []string, args ...any) *redis.Cmd {
	return c.run(ctx, keys, args)
}

func (c *clockedRedis) Eval(ctx context.Context, _ string, keys []string, args ...any) *redis.Cmd {
	return c.run(ctx, keys, args)
}

// driven is a coordinator whose loops a simulation drives instead of starting them: step does
// at now what the loops do by then, a round when a budget was woken (kicked) or one is due.
type driven struct {
	c    *Coordinator
	wake time.Time
}

// step reports whether it ran a round.
func (d *driven) step(ctx context.Context, now time.Time) bool {
	woken := false
	for _, e := range d.c.entries() {
		select {
		case <-e.wake:
			woken = true
		default:
		}
	}
	if !woken && now.Before(d.wake) {
		return false
	}
	d.c.round(ctx, false)
	wakeIn := d.c.interval
	for _, e := range d.c.entries() {
		wakeIn = min(wakeIn, d.c.wakeIn(e))
	}
	d.wake = now.Add(wakeIn)
	return true
}

// simConfig is one simulated run.
type simConfig struct {
	name      string // the budget's name: each run needs its own
	instances int
	workers   int // per instance
	spec      Spec
	interval  time.Duration
	stmt      time.Duration // a statement's execution time, and its predicted cost
	jitter    time.Duration // each statement runs up to this much longer, at random
	duration  time.Duration
	seed      uint64
	down      func(at time.Duration) bool // whether Redis is unreachable at at; nil: never
	lost      float64                     // the probability that a reply is lost
	join      func(i int) time.Duration   // when instance i starts; nil: at once
}

// simResult is what a run admitted and saw.
type simResult struct {
	seconds [][]float64 // per instance, per 100 ms: execution seconds of the statements started in it
	debt    []float64   // per 100 ms: the largest global debt an instance saw after a sync in it
	lease   []float64   // per 100 ms: the largest lease rate an instance held after a sync in it
}

const simBucket = 100 * time.Millisecond

func bucketsOf(from, to time.Duration) (int, int) { return int(from / simBucket), int(to / simBucket) }

// rate is the execution seconds admitted per second over [from, to), all instances.
func (r simResult) rate(from, to time.Duration) float64 {
	b0, b1 := bucketsOf(from, to)
	s := 0.0
	for _, per := range r.seconds {
		for _, x := range per[b0:b1] {
			s += x
		}
	}
	return s / (to - from).Seconds()
}

// perInstance is each instance's admitted execution seconds over [from, to).
func (r simResult) perInstance(from, to time.Duration) []float64 {
	b0, b1 := bucketsOf(from, to)
	out := make([]float64, len(r.seconds))
	for i, per := range r.seconds {
		for _, x := range per[b0:b1] {
			out[i] += x
		}
	}
	return out
}

// maxDebt is the largest global debt seen over [from, to).
func (r simResult) maxDebt(from, to time.Duration) float64 {
	b0, b1 := bucketsOf(from, to)
	return slices.Max(r.debt[b0:b1])
}

// maxWindow is the most execution seconds admitted in a sliding second within [from, to).
func (r simResult) maxWindow(from, to time.Duration) float64 {
	b0, b1 := bucketsOf(from, to)
	total := make([]float64, b1-b0)
	for _, per := range r.seconds {
		for b, x := range per[b0:b1] {
			total[b] += x
		}
	}
	most, per := 0.0, int(time.Second/simBucket)
	for i := 0; i+per <= len(total); i++ {
		s := 0.0
		for _, x := range total[i : i+per] {
			s += x
		}
		most = max(most, s)
	}
	return most
}

type simWorker struct {
	next    time.Time
	running bool
	started time.Time
	req     budget.Request
}

type simInst struct {
	driven
	rng     *rand.Rand
	b       *budget.Budget
	workers []simWorker
	started bool
}

// simulate runs cfg in steps of a millisecond of virtual time.
func simulate(t *testing.T, rc *redis.Client, cfg simConfig) simResult {
	t.Helper()
	// The virtual time, read also by a call that was abandoned and still runs.
	var vt atomic.Int64
	clock := func() time.Time { return t0.Add(time.Duration(vt.Load())) }
	cr := newClockedRedis(t, rc, clock)
	rng := rand.New(rand.NewPCG(cfg.seed, 1))
	if cfg.lost > 0 {
		lostRng := rand.New(rand.NewPCG(cfg.seed, 0)) // its own: an abandoned call draws from its goroutine
		var mu sync.Mutex
		cr.lost = func() bool {
			mu.Lock()
			defer mu.Unlock()
			return lostRng.Float64() < cfg.lost
		}
	}
	nb := int(cfg.duration / simBucket)
	res := simResult{seconds: make([][]float64, cfg.instances), debt: make([]float64, nb), lease: make([]float64, nb)}
	insts := make([]*simInst, cfg.instances)
	for i := range insts {
		r := rand.New(rand.NewPCG(cfg.seed, uint64(i)+2))
		c := newCoord(t, Options{Client: cr, Interval: cfg.interval, Instance: fmt.Sprintf("v%02d", i), Logger: quiet,
			Now: clock, Rand: r.Float64})
		b := budget.New(budget.Spec{Rate: cfg.spec.Rate, Burst: cfg.spec.Burst, MaxConcurrent: cfg.spec.MaxConcurrent})
		insts[i] = &simInst{driven: driven{c: c}, rng: r, b: b, workers: make([]simWorker, cfg.workers)}
		res.seconds[i] = make([]float64, nb)
	}
	spec := cfg.spec
	spec.Name = cfg.name
	ctx := context.Background()
	order := make([]int, len(insts))
	for i := range order {
		order[i] = i
	}
	for el := time.Duration(0); el < cfg.duration; el += time.Millisecond {
		vt.Store(int64(el))
		now := t0.Add(el)
		cr.down.Store(cfg.down != nil && cfg.down(el))
		bucket := int(el / simBucket)
		rng.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		for _, i := range order {
			in := insts[i]
			if cfg.join != nil && el < cfg.join(i) {
				continue
			}
			if !in.started {
				in.started = true
				in.c.Register(spec, in.b)
				for w := range in.workers {
					in.workers[w].next = now
				}
			}
			for w := range in.workers {
				wk := &in.workers[w]
				for !wk.next.After(now) {
					if wk.running {
						actual := wk.next.Sub(wk.started).Seconds()
						budget.Release(now, &wk.req, actual)
						wk.running = false
						res.seconds[i][int(wk.started.Sub(t0)/simBucket)] += actual
						continue // the next statement at once
					}
					reqs := []budget.Request{{Budget: in.b, Cost: cfg.stmt.Seconds()}}
					if _, d := budget.Admit(now, reqs, nil); d != nil {
						wk.next = now.Add(min(max(d.RetryAfter, 20*time.Millisecond), 200*time.Millisecond))
						continue
					}
					wk.req, wk.running, wk.started = reqs[0], true, now
					wk.next = now.Add(cfg.stmt + time.Duration(in.rng.Float64()*float64(cfg.jitter)))
				}
			}
			if in.step(ctx, now) {
				if st := in.c.Status(); len(st) == 1 {
					res.debt[bucket] = max(res.debt[bucket], st[0].GlobalDebt)
					res.lease[bucket] = max(res.lease[bucket], st[0].Rate)
				}
			}
		}
	}
	return res
}

// simRedis is a redis-server for the simulations, which one test may share: each run uses
// its own budget name.
func simRedis(t *testing.T) *redis.Client {
	t.Helper()
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	return newClient(t, redistest.Need(t))
}

// equalDemand is eight instances of four workers each, offering far more than the budget
// (0.5 execution seconds per second, a burst of 1 s) in 50 ms statements, as the
// shared-budget experiment's equal scenario.
func equalDemand(name string, seed uint64) simConfig {
	return simConfig{name: name, instances: 8, workers: 4, spec: Spec{Rate: 0.5, Burst: 1},
		interval: time.Second, stmt: 50 * time.Millisecond, jitter: 10 * time.Millisecond,
		duration: 30 * time.Second, seed: seed}
}

func TestVirtualSimIsDeterministic(t *testing.T) {
	rc := simRedis(t)
	a := simulate(t, rc, equalDemand("det-a", 1))
	b := simulate(t, rc, equalDemand("det-b", 1))
	for i := range a.seconds {
		if !slices.Equal(a.seconds[i], b.seconds[i]) {
			t.Fatalf("instance %d admitted differently in two runs of one simulation", i)
		}
	}
}

// TestOutageUsageIsNotDebt stops Redis for 5 s (as the experiment's sigstop scenario) and for
// 8 s: the instances run on their leases, then on their even shares, within the budget. When
// Redis is back, the usage they ran meanwhile must not become global debt, whose shares would
// fill their buckets and hold the budget below its rate until it drained (at the rate the
// instances leave unused: for tens of seconds). An outage this long outlasts the partition's
// hash, which expires two lease durations after its last sync: the hash the first instance
// back makes anew must count as idle before, or the others' usage of the outage is debt
// when it comes (when the first instance back has no usage to report).
func TestOutageUsageIsNotDebt(t *testing.T) {
	rc := simRedis(t)
	const from = 15 * time.Second
	for _, outage := range []time.Duration{5 * time.Second, 8 * time.Second} {
		for _, stmt := range []time.Duration{50 * time.Millisecond, 100 * time.Millisecond} {
			for seed := uint64(1); seed <= 3; seed++ {
				t.Run(fmt.Sprintf("%v/%v/seed=%d", outage, stmt, seed), func(t *testing.T) {
					cfg := equalDemand(fmt.Sprintf("outage-%v-%v-%d", outage, stmt, seed), seed)
					to := from + outage
					cfg.stmt, cfg.duration = stmt, to+20*time.Second
					cfg.down = func(at time.Duration) bool { return at >= from && at < to }
					r := simulate(t, rc, cfg)
					after := r.rate(to, cfg.duration) / cfg.spec.Rate
					debt := r.maxDebt(to, cfg.duration)
					t.Logf("after the outage: %.3f of the rate; global debt at most %.3f", after, debt)
					if after < 0.95 || after > 1.05 {
						t.Errorf("after the outage the instances admitted %.3f of the rate, want within 5%%", after)
					}
					if debt > cfg.spec.Burst {
						t.Errorf("after the outage the global debt reached %.3f, more than the burst %v", debt, cfg.spec.Burst)
					}
				})
			}
		}
	}
}

// TestUsageFillsOnlyIdleTime runs the script on the simulation's clock: a report's usage
// counts as run age ago, and where the global bucket stood idle then it fills that idle time
// rather than becoming debt, even when usage that ran later was reported first; where
// others' usage kept the bucket busy, it is debt.
func TestUsageFillsOnlyIdleTime(t *testing.T) {
	rc := simRedis(t)
	now := t0
	cr := newClockedRedis(t, rc, func() time.Time { return now })
	ctx := context.Background()
	spec := Spec{Name: "age", Rate: 1, Burst: 10}
	seqs := map[string]uint64{}
	sync := func(id, key string, used float64, age time.Duration) float64 {
		t.Helper()
		seqs[id+key]++
		rep, err := runSync(ctx, cr, id, sec, call{spec: spec,
			reps: []report{{p: &part{key: key}, seq: seqs[id+key], used: used, demand: 1, age: age}}})
		if err != nil {
			t.Fatal(err)
		}
		return rep.results[0].debt
	}
	at := func(d time.Duration) { now = t0.Add(d) }
	for _, key := range []string{"idle", "busy", "order"} {
		at(0)
		sync("a", key, 0, 0)
	}

	// Idle since t0: 3 s used that ran 5 s ago fit in the idle time; 3 s that ran just now
	// are debt.
	at(10 * sec)
	if d := sync("a", "idle", 3, 5*sec); d != 0 {
		t.Fatalf("usage that ran in an idle bucket: debt %v, want 0", d)
	}
	if d := sync("a", "idle", 3, 0); !near(d, 3) {
		t.Fatalf("usage that ran just now: debt %v, want the 3 s used", d)
	}
	// An age out of range counts as none.
	if d := sync("a", "idle", 1, -sec); !near(d, 4) {
		t.Fatalf("a negative age: debt %v, want 3 + 1", d)
	}

	// A partition that Redis does not hold (new, or expired while Redis hung) stood idle:
	// usage that ran 5 s ago fills that time though another instance synced it first.
	at(10 * sec)
	sync("b", "fresh", 0, 0)
	if d := sync("a", "fresh", 3, 5*sec); d != 0 {
		t.Fatalf("usage that ran before the partition was made again: debt %v, want 0", d)
	}

	// Busy: b's 5 s, reported at 5 s, kept the bucket busy until 10 s; a's 3 s that ran
	// from 5 s on are debt.
	at(5 * sec)
	sync("b", "busy", 5, 0)
	at(10 * sec)
	if d := sync("a", "busy", 3, 5*sec); !near(d, 3) {
		t.Fatalf("usage that ran while the bucket was busy: debt %v, want 3", d)
	}

	// Out of order: c's 1 s, which ran just now, is reported before a's 3 s, which ran from
	// 5 s on, while the bucket stood idle: only c's is debt.
	if d := sync("c", "order", 1, 0); !near(d, 1) {
		t.Fatalf("usage that ran just now: debt %v, want 1", d)
	}
	if d := sync("a", "order", 3, 5*sec); !near(d, 1) {
		t.Fatalf("usage that ran in the idle time before, reported after: debt %v, want still 1", d)
	}
}

// TestDebtToHoldIsWhatNoBucketHolds runs the script on the simulation's clock: a lease
// carries the share of the global debt that no live instance's bucket holds, and nothing of
// the debt the buckets hold already.
func TestDebtToHoldIsWhatNoBucketHolds(t *testing.T) {
	rc := simRedis(t)
	now := t0
	cr := newClockedRedis(t, rc, func() time.Time { return now })
	ctx := context.Background()
	spec := Spec{Name: "hold", Rate: 1, Burst: 2}
	parts := map[string]*part{"a": {}, "b": {}, "c": {}}
	sync := func(id string, seq uint64, used, held float64, leave bool) result {
		t.Helper()
		rep, err := runSync(ctx, cr, id, sec, call{spec: spec,
			reps: []report{{p: parts[id], seq: seq, used: used, demand: 10, held: held, leave: leave}}})
		if err != nil {
			t.Fatal(err)
		}
		return rep.results[0]
	}
	for _, id := range []string{"a", "b", "c"} {
		sync(id, 1, 0, 0, false)
	}
	// Each used 0.4 and its bucket holds it: no debt to take on.
	for _, id := range []string{"a", "b"} {
		if r := sync(id, 2, 0.4, 0.4, false); r.hold != 0 {
			t.Fatalf("%s's own usage, in its bucket: hold %v, want 0 (global debt %v)", id, r.hold, r.debt)
		}
	}
	// c ran 0.6 and left: no bucket holds that debt, and a and b share it by their rates,
	// half each, on top of what their buckets hold.
	sync("c", 2, 0.6, 0.6, true)
	for _, id := range []string{"a", "b"} {
		r := sync(id, 3, 0, 0.4, false)
		if !near(r.lease.Rate, 0.5) || !near(r.hold, 0.7) || !near(r.debt, 1.4) {
			t.Fatalf("%s: rate %v, hold %v, want 0.5 of the rate and 0.4 + 0.6/2 (global debt %v, want 1.4)",
				id, r.lease.Rate, r.hold, r.debt)
		}
	}
}

// TestDebtShareIsNotUsageTwice runs equal demand in statements that cost about a lease's
// burst (the budget's over the eight instances) or more: each instance admits one from a
// nearly empty bucket. A lease's share of the global debt must not fill the bucket with
// usage that is in it already (the global bucket counts an instance's usage again when its
// report arrives, after the local bucket did): each instance would then wait for its own
// usage twice, and the budget would run below its rate for good.
func TestDebtShareIsNotUsageTwice(t *testing.T) {
	rc := simRedis(t)
	for _, stmt := range []time.Duration{50 * time.Millisecond, 130 * time.Millisecond, 200 * time.Millisecond} {
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("%v/seed=%d", stmt, seed), func(t *testing.T) {
				cfg := equalDemand(fmt.Sprintf("twice-%v-%d", stmt, seed), seed)
				cfg.stmt, cfg.duration = stmt, 60*time.Second
				r := simulate(t, rc, cfg)
				got := r.rate(10*time.Second, cfg.duration) / cfg.spec.Rate
				t.Logf("%.3f of the rate after 10 s; Jain %.3f", got, jain(r.perInstance(10*time.Second, cfg.duration)))
				if got < 0.95 || got > 1.05 {
					t.Errorf("the instances admitted %.3f of the rate, want within 5%%", got)
				}
			})
		}
	}
}

// TestLateJoinersGetNoRoomTwice runs one instance alone for 5 s, its bucket full at the
// budget's rate, then seven more: the first's burst shrinks to its share and its debt is
// forgiven down to it, while the global bucket stays full. The newcomers' buckets must start
// with the debt no local bucket holds, or the burst that moved is room twice: in the second
// after they join, the budget would admit its rate and most of its burst again.
func TestLateJoinersGetNoRoomTwice(t *testing.T) {
	rc := simRedis(t)
	const join = 5 * time.Second
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			cfg := equalDemand(fmt.Sprintf("joiners-%d", seed), seed)
			cfg.duration = 10 * time.Second
			cfg.join = func(i int) time.Duration {
				if i == 0 {
					return 0
				}
				return join + time.Duration(i)*10*time.Millisecond
			}
			r := simulate(t, rc, cfg)
			most, bound := r.maxWindow(join, cfg.duration), cfg.spec.Rate+cfg.spec.Burst/2
			t.Logf("the most admitted in a second after the join: %.3f", most)
			if most > bound {
				t.Errorf("a second after the join admitted %.3f, more than the rate and half the burst (%v): the moved burst was room twice", most, bound)
			}
		})
	}
}

// TestShortOutagesDoNotHandLeasesOut stops Redis for 1.5 s every 6 s: not long enough for
// the partition to go unsynced for two intervals (what marks an outage to the script), long
// enough, with the retries spread over 0.5 to 1.5 intervals after it, for leases to lapse in
// Redis while their instances still wait to retry, running on their fallback shares. The
// first instance back must not take those shares over as if their instances had crashed:
// the budget would run far above its rate and then pay it back.
func TestShortOutagesDoNotHandLeasesOut(t *testing.T) {
	rc := simRedis(t)
	const period, outage = 6 * time.Second, 1500 * time.Millisecond
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			cfg := equalDemand(fmt.Sprintf("short-%d", seed), seed)
			cfg.duration = 60 * time.Second
			cfg.down = func(at time.Duration) bool { return at > 5*time.Second && at%period < outage }
			r := simulate(t, rc, cfg)
			got := r.rate(10*time.Second, cfg.duration) / cfg.spec.Rate
			most := r.maxWindow(10*time.Second, cfg.duration) / (cfg.spec.Rate + cfg.spec.Burst)
			b0, b1 := bucketsOf(10*time.Second, cfg.duration)
			t.Logf("%.3f of the rate; the largest second %.3f of rate + burst; the largest lease %.3f", got, most, slices.Max(r.lease[b0:b1]))
			if got < 0.95 || got > 1.05 {
				t.Errorf("the instances admitted %.3f of the rate, want within 5%%", got)
			}
			if most > 1 {
				t.Errorf("a second admitted %.3f of rate + burst", most)
			}
		})
	}
}

// TestRecoveringKeepsLapsedSharesFree runs the script on the simulation's clock: a, b and
// c share a budget; c syncs throughout, b stops, and its lease lapses. If a comes back from
// failed syncs then, b may be failing too and running on its fallback share: its share stays
// free for a lease duration. If a's syncs went well, b has crashed, and its share is taken
// up at once.
func TestRecoveringKeepsLapsedSharesFree(t *testing.T) {
	rc := simRedis(t)
	now := t0
	cr := newClockedRedis(t, rc, func() time.Time { return now })
	ctx := context.Background()
	spec := Spec{Name: "recovering", Rate: 1, Burst: 1}
	for _, recovering := range []bool{true, false} {
		key := fmt.Sprint(recovering)
		seqs := map[string]uint64{}
		sync := func(id string, at time.Duration, back bool) budget.Lease {
			t.Helper()
			now = t0.Add(at)
			seqs[id]++
			rep, err := runSync(ctx, cr, id, sec, call{spec: spec,
				reps: []report{{p: &part{key: key}, seq: seqs[id], demand: 10, expected: 3, recovering: back}}})
			if err != nil {
				t.Fatal(err)
			}
			return rep.results[0].lease
		}
		for _, at := range []time.Duration{0, sec} {
			for _, id := range []string{"a", "b", "c"} {
				sync(id, at, false)
			}
		}
		for _, at := range []time.Duration{2 * sec, 3 * sec} {
			sync("c", at, false)
			if !recovering {
				sync("a", at, false)
			}
		}
		// b's lease lapsed 2.5 s after its last sync.
		got := sync("a", 4*sec, recovering)
		if want := map[bool]float64{true: 1.0 / 3, false: 0.5}[recovering]; !near(got.Rate, want) {
			t.Errorf("recovering %v: a's rate %v, want %v", recovering, got.Rate, want)
		}
	}
}
