package coord

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/budget"
)

// minDeadline is the shortest time a script call may take before it counts as failed: shorter
// than the round trip of a loaded Redis, or of a client on a loaded machine, it would fail
// healthy syncs and put the budgets on their fallback share.
const minDeadline = 100 * time.Millisecond

// callDeadline is how long a script call may take when syncs run every interval: a quarter
// interval, at least minDeadline.
func callDeadline(interval time.Duration) time.Duration { return max(interval/4, minDeadline) }

// A sync of many chunks has maxPipelined calls on their way at once: it sends the next before
// the reply to the last comes, so that Redis runs one while the client reads and applies the
// other (see syncBudget). The budgets' loops together have at most maxCalls on their way,
// taking their turns in the order they asked (see start): the size of the connection pool of a
// client made from a URL, so that an instance holds at most that many connections to Redis,
// however many budgets it shares and however long Redis hangs. A budget syncs at least once
// per interval, one round trip a call: maxCalls serve maxCalls × interval ÷ round trip calls
// per interval (README, Known limitations).
const (
	maxPipelined = 2
	maxCalls     = 8
)

// errBusy fails an election call while the last one of the same set is still stuck in the
// client (election.go).
var errBusy = errors.New("coord: the previous Redis call has not returned")

// Options configure a [Coordinator]. Client or URL is required; zero fields take the
// defaults.
type Options struct {
	// Client reaches Redis: a *redis.Client, a Sentinel-backed failover client or a
	// *redis.ClusterClient. Its context deadlines should be enabled (ContextTimeoutEnabled);
	// a call that overruns its deadline is abandoned either way.
	Client redis.UniversalClient
	// URL, used when Client is nil, is the coordination section's redis:// or rediss:// URL:
	// the coordinator makes a client set up for syncs from it and closes it in Close.
	URL string
	// Interval is how often each shared budget syncs; rules.DefaultSyncInterval when zero.
	Interval time.Duration
	// FallbackInstances is the instance count assumed before any was seen;
	// rules.DefaultFallbackInstances when zero.
	FallbackInstances int
	// Instance names this instance in Redis; a random id when empty. Two live coordinators
	// must never share one: a coordinator that replaces another under its id starts only once
	// the other closed into it ([Coordinator.CloseInto]). At most maxInstanceLen bytes: a
	// partition's value in Redis gives each id a 16-bit length (sync.lua).
	Instance string
	// Database identifies the database whose budgets these are (the driver's name for the
	// server and database a connector reaches): instances share a budget only when they name
	// the same database and budget, so that the budgets of one name of two databases (shards,
	// a primary and its standbys) never share their slots, rates or quarantines. Empty, the
	// keys name the budget alone.
	Database string
	// Logger receives one line when Redis becomes unreachable and one when it is back;
	// slog.Default() when nil.
	Logger *slog.Logger
	// Quarantines receives the shared budgets' quarantines in force (quarantine.go); nil:
	// they are published but not read back.
	Quarantines Quarantines
	// Now and Rand replace the clock and the jitter source in tests.
	Now  func() time.Time
	Rand func() float64
}

// Coordinator keeps the shared budgets of one connector in step with the other instances
// through Redis: a background loop per registered budget syncs it about once per interval, or
// early when its budget kicks it, and hands the leases it gets to the budget's [Local].
// Statements never wait for it, and a budget never waits for another's sync: with many
// shared budgets on a slow or hung Redis, a budget that needs a lease (a new partition, a
// lapse) asks for it on its own schedule, in turn for one of the calls on their way
// (maxCalls), not after every other budget's sync.
//
// A Coordinator is safe for concurrent use. Build one with [New], start its loop with
// [Coordinator.Start] and stop it with [Coordinator.Close].
type Coordinator struct {
	rc        redis.UniversalClient
	owned     *redis.Client // made from Options.URL, closed by Close; nil when given a client
	id        string
	database  string // Options.Database
	interval  time.Duration
	fallbackN int
	log       *slog.Logger
	now       func() time.Time
	rand      func() float64
	quar      Quarantines   // nil: none
	sem       chan struct{} // holds the calls on their way (maxCalls)

	mu      sync.Mutex // protects the fields below, and each entry's core
	budgets map[string]*entry
	down    bool // Redis was unreachable at the last sync: logged once
	started bool
	closed  bool
	// seqs is at least every sequence number this coordinator's budgets sent, those of closed
	// registrations included, and those of the coordinator it replaced under the same id: a
	// budget registered starts above it (see seqFloor).
	seqs uint64
	// seen is how many instances each budget whose registration closed last saw sharing it
	// (core.known): the same budget shared again (a reload turned sharing off and on) falls
	// back over them, as it did before, not over FallbackInstances, should Redis not answer
	// its first syncs. Register takes its entry out.
	seen map[string]int
	// ctx is the loops' context from Start until Close (nil otherwise): a budget registered
	// meanwhile starts its loop under it.
	ctx   context.Context
	stop  context.CancelFunc
	loops sync.WaitGroup // the budgets' loops and the want channels' listener
}

// entry is one registered budget.
type entry struct {
	core   *core // guarded by Coordinator.mu
	local  Local // called outside the lock; nil for a budget with nothing to lease
	kicked atomic.Bool
	wake   chan struct{}      // wakes its loop; buffered, never blocks a sender
	stop   context.CancelFunc // ends its loop; nil when none runs (guarded by Coordinator.mu)
	// usage is the storage of local's usage reports, reused from one visit to the next; only
	// its loop (or Sync) uses it.
	usage []budget.Usage
	// busy is how long the budget's last regular sync spent on its calls, the waits of a
	// spread sync left out (see spacing); only its loop (or Sync) uses it.
	busy time.Duration
	// visited is closed once its loop visited it the first time: its first sync answered or
	// failed (Leased).
	visited chan struct{}
}

// New returns a coordinator whose loop is not started. Its errors are an invalid URL, which
// never quotes the URL's credentials, and an instance id longer than maxInstanceLen.
func New(o Options) (*Coordinator, error) {
	if len(o.Instance) > maxInstanceLen {
		return nil, fmt.Errorf("coord: instance id of %d bytes, at most %d", len(o.Instance), maxInstanceLen)
	}
	c := &Coordinator{
		rc: o.Client, id: o.Instance, database: o.Database, interval: o.Interval, fallbackN: o.FallbackInstances,
		log: o.Logger, now: o.Now, rand: o.Rand, quar: o.Quarantines,
		sem:     make(chan struct{}, maxCalls),
		budgets: map[string]*entry{},
		seen:    map[string]int{},
	}
	if c.interval <= 0 {
		c.interval = rules.DefaultSyncInterval
	}
	if c.rc == nil && o.URL != "" {
		rc, err := clientFor(o.URL, c.interval)
		if err != nil {
			return nil, err
		}
		c.rc, c.owned = rc, rc
	}
	if c.fallbackN <= 0 {
		c.fallbackN = rules.DefaultFallbackInstances
	}
	if c.id == "" {
		var b [8]byte
		_, _ = crand.Read(b[:])
		c.id = hex.EncodeToString(b[:])
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.rand == nil {
		c.rand = mrand
	}
	return c, nil
}

// maxInstanceLen bounds an instance id, far above the random ids New makes.
const maxInstanceLen = 256

func mrand() float64 { return rand.Float64() }

// Instance returns this instance's id in Redis.
func (c *Coordinator) Instance() string { return c.id }

// FirstLeaseIn is how soon after a budget's last sync a partition that has no lease yet is
// synced: the RetryAfter for its statements refused meanwhile.
func (c *Coordinator) FirstLeaseIn() time.Duration { return newGap(c.interval) }

// Handle is a registered budget: the local budget kicks it when it starves, and the
// connector changes its spec on a reload or drops it. Safe for concurrent use.
type Handle struct {
	c    *Coordinator
	name string
	e    *entry
}

// Register starts coordinating the budget spec.Name, enforced locally by local, which it
// makes shared (Local.SetShared). Until its first grant a partition keeps the limits local
// held it to, and one that local meets later has the provisional lease (see core.provisional):
// the budget over fallback instances until a sync answers, or, for a budget shared again after
// its registration closed, over the instances it last saw (seen). Registering a name again
// replaces the earlier registration. A budget with no rate and no max_concurrent has nothing to lease
// and local is nil: it is registered only to share its quarantines (spec.Quarantine).
func (c *Coordinator) Register(spec Spec, local Local) *Handle {
	e := &entry{core: newCore(spec, c.interval, c.fallbackN, c.rand), local: local, wake: make(chan struct{}, 1),
		visited: make(chan struct{})}
	c.mu.Lock()
	e.core.known = c.seen[spec.Name] // shared again: the instances it last saw (seen)
	delete(c.seen, spec.Name)
	c.mu.Unlock()
	h := &Handle{c: c, name: spec.Name, e: e}
	if local != nil {
		now := c.now()
		e.core.keepUnkeyed(now)
		// The provisional lease first, so that the budget never meets a partition without
		// one (it is ignored while a registration this one replaces shares the budget: the
		// first visit sets it again). Shared before the loop can see it: a lease handed to a
		// budget not yet shared is dropped, and the loop hands over only the leases that changed.
		local.SetProvisional(e, e.core.provisional())
		local.SetShared(now, e, h.Kick, c.FirstLeaseIn())
	}
	c.mu.Lock()
	if old := c.budgets[spec.Name]; old != nil {
		old.stopLoop()
		c.seqs = max(c.seqs, old.core.seq)
	}
	e.core.seq = c.seqs // numbered above the reports of its name sent so far
	c.budgets[spec.Name] = e
	if c.ctx != nil {
		c.startLoop(e)
	}
	c.mu.Unlock()
	e.signal()
	return h
}

// Kick asks for an early sync: the local budget refused or made wait a statement for want of
// its lease, or met a new partition. It never blocks and costs no call when one is pending.
func (h *Handle) Kick() {
	if h.e.kicked.CompareAndSwap(false, true) {
		h.e.signal()
	}
}

// SetSpec changes the budget's global limits (a reload); the next sync, made at once,
// divides the new limits.
func (h *Handle) SetSpec(spec Spec) {
	h.c.mu.Lock()
	spec = spec.normalize()
	if spec.Quarantine != h.e.core.spec.Quarantine {
		h.e.core.publish = nil // made under the old settings, which the engine lifted
	}
	h.e.core.spec = spec
	h.e.core.next = time.Time{}
	h.c.mu.Unlock()
	h.e.signal()
}

// Close stops coordinating the budget and makes its local budget's own limits apply again,
// unless a later registration of the name steers the same local budget. Its entries in Redis
// lapse within the lease duration.
func (h *Handle) Close() {
	h.c.mu.Lock()
	cur := h.c.budgets[h.name]
	if cur == h.e {
		delete(h.c.budgets, h.name)
		h.e.stopLoop()
		if h.e.core.known > 0 {
			h.c.seen[h.name] = h.e.core.known
		}
	}
	h.c.seqs = max(h.c.seqs, h.e.core.seq)
	h.c.mu.Unlock()
	if l := h.e.local; l != nil {
		l.SetShared(h.c.now(), h.e, nil, 0) // unless a later registration shares it
	}
}

// signal wakes e's loop.
func (e *entry) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// startLoop starts e's loop under c.ctx. The caller holds c.mu.
func (c *Coordinator) startLoop(e *entry) {
	ctx, cancel := context.WithCancel(c.ctx)
	e.stop = cancel
	c.loops.Add(1)
	go func() {
		defer c.loops.Done()
		c.loop(ctx, e)
	}()
}

// stopLoop ends e's loop, if one runs; a sync it is making is abandoned as one past its
// deadline is. The caller holds the coordinator's lock.
func (e *entry) stopLoop() {
	if e.stop != nil {
		e.stop()
		e.stop = nil
	}
}

// Start starts the background loops. It returns at once; Redis being unreachable is not an
// error (the budgets run on their fallback share and the loops keep trying).
func (c *Coordinator) Start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return
	}
	c.started = true
	c.ctx, c.stop = context.WithCancel(context.Background())
	for _, e := range c.budgets {
		c.startLoop(e)
	}
	ctx := c.ctx
	c.loops.Add(1)
	go func() {
		defer c.loops.Done()
		c.listen(ctx)
	}()
}

// Close stops the loop and, within ctx, tells Redis that this instance leaves every
// partition, so that its slots return at once rather than when its leases lapse; makes the
// local budgets' own limits apply again; then closes the client it made from Options.URL.
// The goodbye goes once every sync call of the loops has returned (quiesce), within ctx: a
// sync that Redis ran after it would mark the instance as holding its slots again, until its
// lease lapsed. A Coordinator closed is never started again (Start does nothing).
func (c *Coordinator) Close(ctx context.Context) error { return c.CloseInto(ctx, nil) }

// CloseInto is Close for a coordinator that next, under the same instance id and not started
// yet, replaces (a reload that changed the coordination section): each budget registered with
// both, leased by both or by neither, goes on in next as it was, its leases, usage reports and
// the instances it saw included, under next's settings and spec; no goodbye is said for it. To
// Redis the instance did not leave those partitions: next's first sync renews this one's
// entries, which are its own, so a lone instance is granted the whole budget again rather than
// what the entries of a name that left would leave it; and a failed sync keeps the leases in
// force, as any failed sync does, rather than putting the budget on the provisional lease of
// an instance that never synced. The other budgets say goodbye as Close's do, and next's
// budgets number their reports above every report this coordinator sent: a goodbye that Redis
// runs late, after next registered the same budget again and synced it, is older than the
// entry it finds and changes nothing (sync.lua). With a nil next, a next of another id, or one
// started or closed, it is Close. next is to be started once CloseInto returned.
func (c *Coordinator) CloseInto(ctx context.Context, next *Coordinator) error {
	if next == c || next != nil && next.id != c.id {
		next = nil
	}
	c.mu.Lock()
	stop := c.stop
	c.ctx, c.stop = nil, nil
	c.started, c.closed = true, true // a Start after Close starts nothing
	for _, e := range c.budgets {
		e.stop = nil // ended with c.ctx
	}
	c.mu.Unlock()
	if stop != nil {
		stop()
		c.loops.Wait()
	}
	var errs []error
	if err := c.quiesce(ctx); err != nil {
		errs = append(errs, err) // the goodbyes below fail too, ctx having ended
	}
	for _, e := range c.entries() {
		var chunks [][]report
		c.mu.Lock()
		// next's lock within c's: a coordinator hands over only to the one replacing it.
		adopted := next != nil && next.adopt(e, c.now())
		if !adopted {
			chunks = e.core.leaveAll(c.now())
		}
		spec := e.core.spec
		c.mu.Unlock()
		for _, reps := range chunks {
			if len(reps) == 0 {
				continue // a budget with only quarantines has no partition to leave
			}
			if _, err := c.exec(ctx, call{database: c.database, spec: spec, reps: reps}); err != nil {
				errs = append(errs, err)
				break
			}
		}
		if e.local != nil {
			e.local.SetShared(c.now(), e, nil, 0) // unless a later registration shares it
		}
	}
	if next != nil {
		next.seqFloor(c.seqFloor(0))
	}
	if c.owned != nil {
		errs = append(errs, c.owned.Close())
	}
	return errors.Join(errs...)
}

// adopt makes the state of e, a budget of the coordinator that c replaces under the same id,
// that of c's registration of the same name, if c has one that leases as e does and c was
// neither started nor closed; it reports whether it did. e's loop has ended and its calls
// have returned or been given up (a call given up carries its deadline in Redis's time, as
// within one coordinator). The core goes on under c's settings and the registration's spec:
// its leases keep their expiries (Redis counts the entries that long), its reports still
// pending go again unchanged (counted once), and it syncs at once. Its counters for status
// start again, as a new coordinator's do, and so its first call has the deadline of a first
// call (core.deadline): it may run on a new connection. Redis's clock is forgotten, for c's
// client may reach another Redis. Where the registration's Local is another budget than e's,
// every lease is handed to it at the first visit. The caller holds the lock of e's
// coordinator.
func (c *Coordinator) adopt(e *entry, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	ne := c.budgets[e.core.spec.Name]
	if c.started || c.closed || ne == nil || (ne.local == nil) != (e.local == nil) {
		return false
	}
	old, cur := e.core, ne.core
	old.interval, old.fallbackN, old.rand = cur.interval, cur.fallbackN, cur.rand
	if cur.spec.Quarantine == old.spec.Quarantine {
		old.publish = append(old.publish, cur.publish...)
	} else {
		old.publish = cur.publish // made under the old settings, which the engine lifted
	}
	old.spec = cur.spec
	old.seq = max(old.seq, cur.seq)
	old.next = time.Time{}
	old.redisAt, old.localAt = 0, time.Time{}
	old.syncs, old.failures, old.ignored = 0, 0, 0
	if ne.local != e.local {
		// Another budget, which holds its own limits until a lease is handed to it, as one
		// registered afresh does: each lease goes to it at the first visit. The same budget
		// still enforces what it was handed, which the reports say it applied.
		for _, p := range old.parts {
			p.hasPushed = false
		}
	}
	if ne.local != nil {
		old.keepUnkeyed(now)
	}
	ne.core = old
	e.core = newCore(old.spec, c.interval, c.fallbackN, c.rand) // e is done with it
	e.core.seq = old.seq
	return true
}

// seqFloor raises c's sequence numbers, and those of its budgets, to at least floor, and
// returns the highest of them.
func (c *Coordinator) seqFloor(floor uint64) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seqs = max(c.seqs, floor)
	for _, e := range c.budgets {
		c.seqs = max(c.seqs, e.core.seq)
	}
	for _, e := range c.budgets {
		e.core.seq = c.seqs
	}
	return c.seqs
}

// quiesce waits, within ctx, until no script call of c is on its way: every call the loops
// sent (an abandoned one included, which holds its turn until it returns) has had its reply,
// or failed. It takes every turn among the calls on their way (maxCalls), then gives them
// back. The loops have ended and their contexts with them, so no call asks for a turn after
// it. A call that returned had its reply: Redis ran it. One that failed at its deadline may
// still sit in a socket, but Redis does not act on it past its notAfter.
func (c *Coordinator) quiesce(ctx context.Context) error {
	taken := 0
	defer func() {
		for range taken {
			<-c.sem
		}
	}()
	for ; taken < maxCalls; taken++ {
		select {
		case c.sem <- struct{}{}:
		case <-ctx.Done():
			return fmt.Errorf("coord: a sync call still on its way at close: %w", ctx.Err())
		}
	}
	return nil
}

func (c *Coordinator) entries() []*entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*entry, 0, len(c.budgets))
	for _, e := range c.budgets {
		out = append(out, e)
	}
	return out
}

// loop is e's loop: it visits the budget when it is due (wakeIn) or woken (a kick, a new
// spec, a want message), until ctx ends.
func (c *Coordinator) loop(ctx context.Context, e *entry) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for first := true; ; first = false {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-e.wake:
		}
		_ = c.visit(ctx, e, false) // a failure is counted and logged (logReachability), and retried on schedule
		if first {
			close(e.visited)
		}
		timer.Reset(c.wakeIn(e))
	}
}

// Leased waits until each budget registered with a local budget to lease has been visited by
// its loop once (its first sync answered, or failed), for at most a call's deadline: so a
// connector opens with its shared budgets' leases, a lone instance with the whole budget,
// rather than on the provisional lease (the budget over fallback instances), which refused
// the first burst of an instance alone. Redis slow or unreachable, it returns after that
// deadline, the budgets on the provisional lease until a sync answers.
func (c *Coordinator) Leased() {
	c.mu.Lock()
	var visits []chan struct{}
	for _, e := range c.budgets {
		if e.local != nil {
			visits = append(visits, e.visited)
		}
	}
	c.mu.Unlock()
	deadline := time.NewTimer(callDeadline(c.interval))
	defer deadline.Stop()
	for _, v := range visits {
		select {
		case <-v:
		case <-deadline.C:
			return
		}
	}
}

// listen hands the messages of the budgets' want channels ([WantChannel]) to their budgets
// until ctx ends: a holder of slots that another instance wants syncs early. Without the
// subscription (Redis unreachable, a Redis user denied the channels) the holders hand them
// over at their next regular syncs, as they would anyway; a failed subscription is tried
// again after an interval, then after twice as long each time up to 64 intervals, since
// each try dials Redis (go-redis's own channel would redial, and log, every 100ms).
func (c *Coordinator) listen(ctx context.Context) {
	if c.rc == nil {
		return
	}
	ps := c.rc.PSubscribe(ctx, KeyPrefix+"*"+wantSuffix)
	defer ps.Close()
	defer context.AfterFunc(ctx, func() { _ = ps.Close() })() // ends a Receive that waits
	wait := c.interval
	for {
		m, err := ps.ReceiveTimeout(ctx, listenQuiet*c.interval)
		var ne net.Error
		switch {
		case ctx.Err() != nil:
			return
		case errors.As(err, &ne) && ne.Timeout():
			err = ps.Ping(ctx) // quiet: a connection that cannot take a ping is redialled
		case err == nil:
			if msg, ok := m.(*redis.Message); ok {
				c.wanted(msg.Channel, msg.Payload)
			}
		}
		if err == nil {
			wait = c.interval
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, listenBackoff*c.interval)
	}
}

// A want channel's subscription is pinged after listenQuiet intervals without a message, and
// tried again at most listenBackoff intervals after a failure.
const (
	listenQuiet   = 10
	listenBackoff = 64
)

// wanted marks the partition named by a message on a want channel to sync early, and wakes
// its budget's loop when it did.
func (c *Coordinator) wanted(channel, field string) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, e := range c.budgets {
		if WantChannel(c.database, name) == channel && e.core.wanted(now, field) {
			e.signal()
		}
	}
}

// wakeIn is how long e's loop may sleep: until the budget needs it.
func (c *Coordinator) wakeIn(e *entry) time.Duration {
	now := c.now()
	c.mu.Lock()
	d := min(c.interval, e.core.nextWake(now).Sub(now))
	c.mu.Unlock()
	return max(d, c.interval/100, time.Millisecond)
}

// Sync syncs every registered budget now, whether due or not, one after another, and returns
// their errors joined. The loops do the same on their own schedules; Sync is for tests and
// tools, and must not run beside started loops (a budget's sync would run twice at once).
func (c *Coordinator) Sync(ctx context.Context) error { return c.round(ctx, true) }

// round visits each budget once, as its loop would (visit); force syncs each whether due or not.
func (c *Coordinator) round(ctx context.Context, force bool) error {
	var errs []error
	for _, e := range c.entries() {
		errs = append(errs, c.visit(ctx, e, force))
	}
	return errors.Join(errs...)
}

// visit looks at budget e: takes its usage, syncs it if due (or if force), and hands changed
// leases to its local budget. It returns the sync's error, if it made one.
func (c *Coordinator) visit(ctx context.Context, e *entry, force bool) error {
	kicked := e.kicked.Swap(false)
	now := c.now()
	var usage []budget.Usage
	if e.local != nil {
		usage = e.local.TakeUsage(now, e.usage[:0])
	}
	c.mu.Lock()
	e.core.absorb(now, usage)
	clear(usage) // absorbed: keep the storage for the next visit, not the keys
	e.usage = usage[:0]
	due := force || e.core.due(now, kicked)
	var chunks [][]report
	regular := false
	if due {
		if regular = force || e.core.regular(now); regular {
			chunks = e.core.reports(now)
		} else {
			chunks = e.core.earlyReports(now)
		}
		if len(chunks) == 0 {
			e.core.nothingToSync(now)
		}
	}
	spec := e.core.spec
	c.mu.Unlock()

	var quarantines []Quarantined
	var err error
	if len(chunks) > 0 {
		var spacing time.Duration
		if regular && !force {
			spacing = c.spacing(e.busy, len(chunks))
		}
		var busy time.Duration
		quarantines, busy, err = c.syncBudget(ctx, e, spec, chunks, spacing)
		if regular {
			e.busy = busy
		}
	}
	if len(quarantines) > 0 && c.quar != nil {
		c.quar.AddQuarantines(c.now(), spec, quarantines)
	}
	if e.local == nil {
		return err
	}

	// The leases that changed otherwise: a lease decaying after it lapsed, a partition's
	// first fallback share; and the provisional lease, which follows the instances seen and
	// whether Redis answers.
	now = c.now()
	c.mu.Lock()
	pushes := e.core.pushes(now)
	prov := e.core.provisional()
	c.mu.Unlock()
	e.local.SetProvisional(e, prov)
	e.handOver(now, nil, pushes)
	return err
}

// syncSpreadNum/syncSpreadDen is how much of the interval a long regular sync spreads its
// calls over (see spacing).
const (
	syncSpreadNum = 4
	syncSpreadDen = 5
)

// spacing is how far apart a regular sync sends its n calls, given how long the budget's last
// regular sync was busy with its calls. A sync that was busy for more than half the spread (a
// budget of tens of thousands of partitions) spreads its calls evenly over the spread, four
// fifths of the interval, so that each partition is renewed at the same offset into every
// sync, an interval after the last, however fast Redis answers this time: sent as fast as
// Redis answers, a partition late in a slow sync that follows a fast one waits an interval
// plus the difference. A Redis slower than the spread sets the pace as before. A shorter sync
// goes at once (0: not spread), for the early syncs of every budget wait for the sync under
// way.
func (c *Coordinator) spacing(busy time.Duration, n int) time.Duration {
	spread := c.interval * syncSpreadNum / syncSpreadDen
	if n < 2 || busy <= spread/2 {
		return 0
	}
	return spread / time.Duration(n)
}

// syncBudget sends a budget's reports, one script call per chunk, each within its own
// deadline well under the interval: a budget with many active partitions makes many calls,
// and one deadline over all of them would fail a healthy Redis. Each chunk's leases count
// from its own send. The first call of a budget with shared quarantines also publishes this
// instance's new quarantines and reads back those in force, which syncBudget returns (nil
// when it read none).
//
// The calls go two at a time: the next chunk's call is sent before the reply to the last
// one is read, so that Redis always has a call to run while the client reads and applies a
// reply (one at a time, Redis stood idle between calls: integration/PERFORMANCE.md). The
// replies are applied in order, and each reply's leases are handed to the local budget as it is
// applied, while Redis runs the next call: a sync of many calls neither leaves Redis idle
// while the client hands over every lease at its end, nor keeps the leases of its first
// calls from the local budget until then. After a failed call the
// sync ends; the call sent after it, if any, is abandoned as a call past its deadline is,
// and its partitions' reports, still pending, go again in the next sync (Redis counts a
// report once, by its sequence number). A call that fails because ctx ended (the
// coordinator closing, the budget's registration closed or replaced, a caller of Sync giving
// up) is no failure of Redis: it ends the sync as well, but is neither counted nor logged,
// and does not put the budget on its fallback share.
//
// With spacing, chunk k is sent no sooner than k × spacing after the first (see spacing). It
// returns, besides, how long the sync was busy: from its first call to its last reply, less
// what it waited for its chunks' times.
func (c *Coordinator) syncBudget(ctx context.Context, e *entry, spec Spec, chunks [][]report,
	spacing time.Duration) (_ []Quarantined, busy time.Duration, _ error) {
	c.mu.Lock()
	d := e.core.deadline()
	answered := e.core.streak == 0 && e.core.syncs > 0 // its last sync succeeded
	c.mu.Unlock()
	// flights are the calls on their way, oldest first, each with the wait for its reply.
	type flight struct {
		cl   call
		wait func() (reply, error)
	}
	var flights []flight
	next := 0 // the next chunk to send
	// The chunks' times, and how long the sync was busy, are on the real clock, as the waits
	// for them are (c.now may be a test's clock that stands still).
	begun, waited := time.Now(), time.Duration(0)
	untilDue := func(k int) time.Duration { return time.Duration(k)*spacing - time.Since(begun) }
	// send sends the chunks whose time has come, up to maxPipelined on their way.
	send := func() {
		for ; next < len(chunks) && len(flights) < maxPipelined && untilDue(next) <= 0; next++ {
			sent := c.now()
			cl := call{database: c.database, spec: spec, reps: chunks[next], quarantines: next == 0 && spec.Quarantine != (QuarantineSpec{}), at: sent}
			c.mu.Lock()
			cl.notAfter = e.core.notAfter(sent, d)
			if cl.quarantines {
				cl.publish = e.core.takePublish(sent)
			}
			c.mu.Unlock()
			flights = append(flights, flight{cl: cl, wait: c.start(ctx, d, cl)})
		}
	}
	// resend sends cl again, late: its deadline passed although Redis answered the budget's
	// last sync (answered): more likely a client short of CPU, or a chunk queued behind another
	// in Redis, than a Redis gone. Once, with twice the deadline: a Redis that hangs fails it
	// too, and the syncs after that failure send nothing again, so that a hung Redis is found
	// within a deadline. Its reports count once whatever the retries (sync.lua), and the call
	// it replaces does not act past its notAfter.
	resend := func(cl call) (call, reply, error) {
		cl.at = c.now()
		c.mu.Lock()
		cl.notAfter = e.core.notAfter(cl.at, 2*d)
		c.mu.Unlock()
		rep, err := c.start(ctx, 2*d, cl)()
		return cl, rep, err
	}
	var quarantines []Quarantined
	for send(); len(flights) > 0 || next < len(chunks); send() {
		if len(flights) == 0 {
			// Nothing on its way: the next chunk's time has not come (a spread sync).
			wait := untilDue(next)
			if err := sleep(ctx, wait); err != nil {
				return quarantines, time.Since(begun) - waited, err
			}
			waited += wait
			continue
		}
		cl, wait := flights[0].cl, flights[0].wait
		flights = flights[1:]
		rep, err := wait()
		if answered && late(err) && ctx.Err() == nil {
			answered = false // once a sync
			cl, rep, err = resend(cl)
		}
		now := c.now()
		var dropped []string
		var pushes []push
		// Abandoned because ctx ended: no failure of Redis (see above).
		stopped := err != nil && ctx.Err() != nil
		c.mu.Lock()
		e.core.clock(rep.now, now)
		if err != nil {
			if !stopped {
				e.core.failed(cl.at, now)
			}
			if e.core.spec.Quarantine == spec.Quarantine {
				e.core.unpublished(cl.publish)
			}
		} else {
			dropped = e.core.applied(cl.at, now, cl.reps, rep.results)
			if e.local != nil {
				pushes = e.core.pushesOf(cl.reps, now)
			}
			e.core.ignored += uint64(rep.ignored)
		}
		changed := !stopped && c.reachabilityChanged(err)
		c.mu.Unlock()
		if changed {
			c.logReachability(err) // the log's handler is the application's code: not under c.mu
		}
		if err != nil {
			return quarantines, time.Since(begun) - waited, err
		}
		send() // before the hand-over, so that Redis has the next call meanwhile
		e.handOver(now, dropped, pushes)
		if cl.quarantines {
			quarantines = make([]Quarantined, len(rep.quarantines))
			for j, q := range rep.quarantines {
				quarantines[j] = Quarantined{Fingerprint: q.fp, Until: now.Add(q.left)}
			}
		}
	}
	return quarantines, time.Since(begun) - waited, nil
}

// late reports whether err is a call's deadline passing: its context's, or the connection's
// read deadline that the client set from it.
func late(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// sleep waits for d, or until ctx ends, whose error it then returns.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// handOver hands leases to e's local budget, if it has one, at now: none for the partitions
// dropped, and pushes. It is called without c.mu: the budget takes its own lock.
func (e *entry) handOver(now time.Time, dropped []string, pushes []push) {
	if e.local == nil {
		return
	}
	for _, key := range dropped {
		e.local.DropLease(now, key)
	}
	for _, p := range pushes {
		e.local.SetLease(now, p.key, p.lease)
	}
}

// reachabilityChanged records whether Redis answered (err is the sync's outcome) and reports
// whether that changed since the last sync: the caller logs the change once it unlocked c.mu
// (logReachability), so that each change is logged once. The caller holds c.mu.
func (c *Coordinator) reachabilityChanged(err error) bool {
	if down := err != nil; down != c.down {
		c.down = down
		return true
	}
	return false
}

// logReachability logs a change between reachable and unreachable, err being the sync's outcome
// that made it. The error text comes from the client and names the address, never the URL's
// credentials.
func (c *Coordinator) logReachability(err error) {
	var refused redis.Error // Redis answered, with an error: an ACL, maxmemory, a script
	switch {
	case errors.As(err, &refused):
		c.log.Warn("pgtraffic: Redis refused the coordination calls; shared budgets run on their last leases, then on an even share",
			"instance", c.id, "error", err)
		return
	case err != nil:
		c.log.Warn("pgtraffic: Redis unreachable; shared budgets run on their last leases, then on an even share",
			"instance", c.id, "error", err)
		return
	}
	c.log.Info("pgtraffic: Redis reachable again; shared budgets resynced", "instance", c.id)
}

// exec runs one script call, abandoning it when ctx ends (see start).
func (c *Coordinator) exec(ctx context.Context, cl call) (reply, error) {
	return c.start(ctx, 0, cl)()
}

// start sends one script call, with a deadline of d unless d is 0, and returns at once; wait
// returns its outcome, or abandons the call when its deadline passes or ctx ends even if the
// client does not honour them. The call first waits for its turn among the outstanding calls
// (maxCalls, taken in the order asked), within its deadline: the budgets' loops share
// them. An abandoned call finishes in the background and holds its place among the
// outstanding calls until it has.
func (c *Coordinator) start(ctx context.Context, d time.Duration, cl call) (wait func() (reply, error)) {
	cancel := context.CancelFunc(func() {})
	if d > 0 {
		ctx, cancel = context.WithTimeout(ctx, d)
	}
	type outcome struct {
		res reply
		err error
	}
	ch := make(chan outcome, 1)
	var sent atomic.Bool // it had its turn
	go func() {
		select {
		case c.sem <- struct{}{}:
		case <-ctx.Done():
			ch <- outcome{err: noTurn(ctx)}
			return
		}
		if ctx.Err() != nil {
			// Its turn and the end of ctx came together (select chose the turn): a call of
			// a loop that ended must not be sent after Close's goodbye (quiesce).
			<-c.sem
			ch <- outcome{err: noTurn(ctx)}
			return
		}
		sent.Store(true)
		res, err := runSync(ctx, c.rc, c.id, c.interval, cl)
		<-c.sem // before the answer, so that the next call never finds this one outstanding
		ch <- outcome{res, err}
	}()
	// A call that nobody waits for (the sync ended at an earlier one) ends at its deadline.
	return func() (reply, error) {
		defer cancel()
		select {
		case o := <-ch:
			return o.res, o.err
		case <-ctx.Done():
			if !sent.Load() {
				return reply{}, noTurn(ctx)
			}
			return reply{}, ctx.Err()
		}
	}
}

// errNoTurn fails a call that waited for its turn among the calls on their way
// (maxCalls) until its deadline: Redis answers, but the shared budgets' syncs need more
// round trips per interval than maxCalls calls at a time give (many shared budgets on a
// distant Redis, or a short sync_interval).
var errNoTurn = errors.New("coord: the Redis call found no turn among the calls on their way within its deadline " +
	"(more shared budgets than this Redis's round trip serves per sync_interval)")

// noTurn is errNoTurn, for the call whose ctx ended, matching ctx's error too.
func noTurn(ctx context.Context) error { return fmt.Errorf("%w: %w", errNoTurn, ctx.Err()) }

// Status reports every registered budget, sorted by name.
func (c *Coordinator) Status() []Status {
	now := c.now()
	c.mu.Lock()
	out := make([]Status, 0, len(c.budgets))
	for _, e := range c.budgets {
		out = append(out, e.core.status(now))
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Name, b.Name) })
	return out
}
