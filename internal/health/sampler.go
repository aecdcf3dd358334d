package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

const (
	// ApplicationName is the sampler connection's application_name, so that
	// it can be told apart in pg_stat_activity.
	ApplicationName = "pgtraffic-health"
	// StaleIntervals is how many intervals old a sample may be before it is stale.
	StaleIntervals = 3
	// CloseTimeout bounds the closing of a health connection: the sampler's, or one a
	// [Conn] implementation opens on the side.
	CloseTimeout = time.Second

	minConnectTimeout = 5 * time.Second
	connectKey        = "(connect)" // error-tracking key of the connection itself

	// The failed reads of the metrics a round could not read on a connection: it broke
	// during the round, or it could not be opened.
	errConnLost     = "connection lost"
	errNotConnected = "not connected"
)

var errClosed = errors.New("health: sampler closed")

// errWaiting means a round was skipped because the reconnect backoff has not
// elapsed; the readings stay marked failed from the connect that failed.
var errWaiting = errors.New("health: waiting to reconnect")

// Options configures a [Sampler]. Every field but Connect has a default.
type Options struct {
	// Connect opens the dedicated connection; the driver passes one that opens a pgx
	// connection with the connector's config (package pgxconn). The sampler bounds ctx
	// and then names the session [ApplicationName].
	Connect func(ctx context.Context) (Conn, error)
	// Interval between sampling rounds; default [vocab.DefaultHealthInterval]. Choose it
	// to oversample the thresholds (1-2s for a 5s replication lag limit).
	Interval time.Duration
	// Timeout bounds each read; default Interval/2, so that one slow read
	// still leaves room in the interval for the next round and a server too
	// busy to answer a catalog query within half an interval reads as stale.
	// A connect is allowed max(Timeout, 5s).
	Timeout time.Duration
	// Metrics to sample: [vocab.MetricActiveQueries], [vocab.MetricReplicationLag] and
	// [vocab.MetricCustomPrefix]+name; [vocab.MetricInFlight] is accepted and ignored.
	Metrics []string
	// Queries maps a custom metric's name (without [vocab.MetricCustomPrefix]) to its SQL.
	Queries map[string]string
	// Logger receives read failures, staleness and recoveries, each once per
	// change (an active_queries read that fails on other roles' backends the
	// sampling role cannot see, once); default slog.Default().
	Logger *slog.Logger
	// Now is the clock used to timestamp samples; default time.Now.
	Now func() time.Time
	// Election, when set, shares one sampler among the instances that read the same database
	// with the same metric set (see [Election]); nil: this sampler samples for itself.
	Election Election
	// Replaces is the sampler this one takes over from, when a reload changes what a Sampler
	// cannot (its interval). Its readings of the metrics it still reads carry over, as
	// through [Sampler.SetMetrics]: the new sampler starts from the last sample rather than
	// from none, which would neither throttle nor count as stale until its first read. A
	// reading carried over is judged by the interval of the sampler that took it until the new
	// sampler reads the metric: lowering the interval does not make a sample stale that was
	// not, nor raising it one fresh that was stale. The caller still closes the sampler
	// replaced.
	Replaces *Sampler
}

// Sampler reads server health metrics on a dedicated connection and serves
// the last sample to throttle checks.
//
// One goroutine (started by [Sampler.Start]) runs a round per interval; each
// round reads every configured metric, bounded by the timeout, and publishes
// an immutable snapshot through an atomic pointer. [Sampler.Value] and
// [Sampler.Evaluate] only load that pointer, so they never wait for I/O.
// Rounds never overlap: the loop and [Sampler.SampleOnce] take turns on the
// connection, which a round checks out of the session and gives back, holding
// no lock while it reads.
//
// With an [Election], a round first votes: the lead samples as above and
// publishes its readings; a follower adopts the lead's published readings in
// place of reading the server, and polls again soon after the lead's next
// sample is due.
//
// A Sampler is created by [NewSampler]; its zero value is not usable. It is
// safe for concurrent use. [Sampler.Close] releases the goroutine and the
// connection.
type Sampler struct {
	connect        func(context.Context) (Conn, error)
	interval       time.Duration
	timeout        time.Duration
	connectTimeout time.Duration
	log            *slog.Logger
	now            func() time.Time

	snap         atomic.Pointer[snapshot]
	errors       atomic.Uint64
	samples      atomic.Uint64 // good metric reads
	shared       atomic.Uint64 // good readings adopted from the elected sampler
	elections    atomic.Uint64 // times this sampler became or stopped being the lead
	hiddenLogged atomic.Bool   // an active_queries read failed on backends the role cannot see: logged
	unconfigured sync.Map      // metric -> struct{}: thresholds already logged as not sampled

	life context.Context // canceled by Close; parent of all I/O
	kill context.CancelFunc
	wake chan struct{} // buffered(1): the metric set changed
	done chan struct{} // closed when the loop returns

	sess session

	mu       sync.Mutex // protects the fields below and serialises snapshot publication
	cfg      *config
	election Election // nil: sample alone
	connErr  string   // the connect error last logged, "" when connected
	started  bool
	closed   bool
}

// session is the dedicated connection and what rounds carry from one to the next. A round
// takes it whole (take), does its I/O holding no lock, and gives it back (give); a round that
// finds it taken waits for the other's end on a channel, which its context can abandon.
type session struct {
	mu      sync.Mutex // protects the fields below; never held across I/O
	t       turn       // the state between rounds; its conn is nil while busy
	busy    bool       // a round holds t
	ended   chan struct{}
	closing bool // close the connection when the round in progress gives it back
}

// turn is what a round owns while it runs.
type turn struct {
	conn     Conn
	failures int       // consecutive failed connects
	retryAt  time.Time // no loop round connects before this
	// lead is the ballot this sampler held the lease of at its last round, through el; zero
	// when it held none.
	lead     Ballot
	el       Election
	follows  bool   // the last vote answered, and made this sampler a follower
	electErr string // the election error logged when it began failing, "" while the election answers
	// tried is when each metric was last read (or tried), for the order of the reads of
	// those whose last read failed (readOrder).
	tried map[string]time.Time
}

// config is an immutable metric set.
type config struct {
	defs  map[string]string // readable metric -> SQL
	order []string          // keys of defs, sorted: rounds read in a stable order
	set   string            // the Ballot.Set of defs at the sampler's interval
}

// snapshot is an immutable set of readings, one per configured metric.
type snapshot struct {
	readings map[string]reading
	// dropped holds the metrics the last SetMetrics no longer reads, and when: a statement
	// decided by the rules a reload just replaced may still throttle on one (see Evaluate).
	dropped map[string]time.Time
	// replaced is closed when the next snapshot replaces this one (see Published).
	replaced chan struct{}
}

// store publishes readings as the new snapshot, with the dropped metrics of the last, and closes
// the old one's replaced channel, so that a statement waiting for health tries again the moment
// a sample arrives. The caller holds s.mu (or owns s alone).
func (s *Sampler) store(readings map[string]reading) {
	var dropped map[string]time.Time
	if old := s.snap.Load(); old != nil {
		dropped = old.dropped
	}
	s.storeDropped(readings, dropped)
}

// storeDropped is store with the dropped metrics given.
func (s *Sampler) storeDropped(readings map[string]reading, dropped map[string]time.Time) {
	old := s.snap.Swap(&snapshot{readings: readings, dropped: dropped, replaced: make(chan struct{})})
	if old != nil {
		close(old.replaced)
	}
}

// Published returns a channel closed when the next snapshot of readings is published: a
// statement that health throttles waits on it (and its max_wait) to try again at once.
func (s *Sampler) Published() <-chan struct{} { return s.snap.Load().replaced }

// reading is one metric's state in a snapshot.
type reading struct {
	sql   string    // what produced it ("" for a metric that cannot be read)
	value float64   // last good value
	at    time.Time // when the last good value was read
	good  bool      // value and at are set
	// err is why the most recent read failed; "" after a good read. A failure does not
	// clear the last good value: Evaluate judges that by its age (see there).
	err   string
	since time.Time // when the metric was configured: before its first read it is not stale
	// until it has gone unread for StaleIntervals intervals since then
	// interval is that of the sampler that read value (before any good read, that configured
	// the metric): a reading carried over from a sampler at another interval ([Options.Replaces])
	// is stale after StaleIntervals of its own intervals, as it would have been, until the
	// new sampler reads it.
	interval time.Duration
	// staleLogged is shared by every snapshot's copy of this metric's
	// reading, so that Evaluate logs the start of staleness once without a lock.
	staleLogged *atomic.Bool
}

// result is the outcome of one read in a round, before publication.
type result struct {
	metric string
	sql    string
	value  float64
	at     time.Time // when it was read; for a failed connect, when the loop retries
	err    string    // "" on success
	report bool      // count the failure and log it when it changed
	shared bool      // adopted from the elected sampler, not read here
}

// readError is the error SampleOnce returns for one failed read.
type readError struct {
	metric string
	reason string
	err    error
}

func (e *readError) Error() string { return "health: " + e.metric + ": " + e.reason }
func (e *readError) Unwrap() error { return e.err }

// NewSampler returns a sampler for o. It does not connect: the connection is
// opened by the first round that has a metric to read.
func NewSampler(o Options) *Sampler {
	s := &Sampler{
		connect:  o.Connect,
		interval: o.Interval,
		timeout:  o.Timeout,
		log:      o.Logger,
		now:      o.Now,
		wake:     make(chan struct{}, 1),
		done:     make(chan struct{}),
		cfg:      &config{defs: map[string]string{}},
		election: o.Election,
	}
	if s.interval <= 0 {
		s.interval = vocab.DefaultHealthInterval
	}
	if s.timeout <= 0 {
		s.timeout = s.interval / 2
	}
	s.connectTimeout = max(s.timeout, minConnectTimeout)
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.life, s.kill = context.WithCancel(context.Background())
	if o.Replaces != nil {
		// SetMetrics below keeps what the replaced sampler read, and drops the rest.
		old := o.Replaces.snap.Load()
		s.storeDropped(old.readings, old.dropped)
	} else {
		s.store(map[string]reading{})
	}
	s.SetMetrics(o.Metrics, o.Queries)
	return s
}

// Start starts the sampling goroutine. It is idempotent, and a no-op after
// Close. The goroutine connects lazily, samples at once whenever the metric
// set changes and then every interval, and reconnects with backoff.
func (s *Sampler) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.closed {
		return
	}
	s.started = true
	go s.loop()
}

// Close stops the goroutine, waits for it and closes the connection.
// Later calls return nil; Value and Evaluate keep serving the last sample.
func (s *Sampler) Close() error {
	started, ok := s.markClosed()
	if !ok {
		return nil
	}
	s.kill()
	if started {
		<-s.done
	}
	if b, el := s.sess.leading(); el != nil {
		// Hand the lease over now rather than when it lapses.
		ctx, cancel := context.WithTimeout(context.Background(), s.electTimeout())
		_ = el.Resign(ctx, b) // it lapses anyway
		cancel()
	}
	if err := s.sess.close(); err != nil {
		return fmt.Errorf("health: closing the sampler connection: %w", err)
	}
	return nil
}

// markClosed marks s closed and reports whether its goroutine was started; ok is false if s
// was closed already.
func (s *Sampler) markClosed() (started, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false, false
	}
	s.closed = true
	return s.started, true
}

// SetMetrics replaces the metric set (on a config reload). Readings of
// metrics that keep their name survive, also when their query changed (a
// custom query reworded or fixed): the last reading stays in force until the
// new query is read, which the next round does at once, so that a reload
// neither lifts nor starts throttling by itself. A metric that cannot be
// read (unknown name, custom metric without a query) is logged, counted and
// stays stale. An empty set stops sampling and closes the connection: at
// once, or when the round in progress ends (SetMetrics does not wait for it).
func (s *Sampler) SetMetrics(metrics []string, queries map[string]string) {
	cfg, bad := buildConfig(metrics, queries, s.interval)
	s.setConfig(cfg, bad)
	s.unconfigured.Clear()
	for _, m := range slices.Sorted(maps.Keys(bad)) {
		s.errors.Add(1)
		s.log.Error("health: metric cannot be sampled; it counts as stale", "metric", m, "error", bad[m])
	}
	if len(cfg.order) == 0 {
		if err := s.sess.close(); err != nil {
			s.log.Warn("health: closing the sampler connection", "error", err)
		}
	}
	select {
	case s.wake <- struct{}{}:
	default: // a wake-up is already pending
	}
}

// setConfig makes cfg the metric set, with bad the metrics that cannot be read, and publishes
// the readings that survive it.
func (s *Sampler) setConfig(cfg *config, bad map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg = cfg
	old := s.snap.Load().readings
	next := make(map[string]reading, len(cfg.defs)+len(bad))
	for m, sql := range cfg.defs {
		if r, ok := old[m]; ok {
			r.sql = sql // a round still reading the query replaced publishes nothing
			next[m] = r
			continue
		}
		next[m] = reading{sql: sql, since: s.now(), interval: s.interval, staleLogged: new(atomic.Bool)}
	}
	for m, why := range bad {
		next[m] = reading{err: why, interval: s.interval, staleLogged: new(atomic.Bool)}
	}
	now := s.now()
	dropped := map[string]time.Time{}
	for m := range old {
		if _, ok := next[m]; !ok {
			dropped[m] = now
		}
	}
	for m, at := range s.snap.Load().dropped { // dropped by an earlier SetMetrics, and still
		if _, ok := next[m]; !ok && now.Sub(at) <= StaleIntervals*s.interval {
			dropped[m] = at
		}
	}
	s.storeDropped(next, dropped)
}

// SetElection makes el the election of the rounds to come (nil: sample alone). A lease held
// through the previous election is given up at the next round.
func (s *Sampler) SetElection(el Election) {
	s.mu.Lock()
	s.election = el
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// buildConfig resolves metric names to SQL; bad maps each metric that cannot
// be read to the reason.
func buildConfig(metrics []string, queries map[string]string, interval time.Duration) (cfg *config, bad map[string]string) {
	cfg = &config{defs: make(map[string]string, len(metrics))}
	bad = map[string]string{}
	for _, m := range metrics {
		switch {
		case m == vocab.MetricInFlight:
		case m == vocab.MetricActiveQueries:
			cfg.defs[m] = activeQueriesSQL
		case m == vocab.MetricReplicationLag:
			cfg.defs[m] = replicationLagSQL
		case strings.HasPrefix(m, vocab.MetricCustomPrefix):
			name := strings.TrimPrefix(m, vocab.MetricCustomPrefix)
			if q := queries[name]; strings.TrimSpace(q) != "" {
				cfg.defs[m] = q
			} else {
				bad[m] = fmt.Sprintf("no query named %q under health_queries", name)
			}
		default:
			bad[m] = "unknown metric"
		}
	}
	cfg.order = slices.Sorted(maps.Keys(cfg.defs))
	cfg.set = setKey(interval, cfg.order, cfg.defs)
	return cfg, bad
}

// Value returns metric's last good sample and when it was read; ok is false
// if it has never been read successfully. It never blocks on I/O.
func (s *Sampler) Value(metric string) (v float64, at time.Time, ok bool) {
	r, found := s.snap.Load().readings[metric]
	if !found || !r.good {
		return 0, time.Time{}, false
	}
	return r.value, r.at, true
}

// Errors returns how many reads and connects have failed, plus metrics that
// could not be configured, since the sampler was created.
func (s *Sampler) Errors() uint64 { return s.errors.Load() }

// Samples reports how many metric reads succeeded (one per metric per round).
func (s *Sampler) Samples() uint64 { return s.samples.Load() }

// Shared reports how many good readings were adopted from the elected sampler in place of
// reading the server (one per metric per follower round that found a new sample).
func (s *Sampler) Shared() uint64 { return s.shared.Load() }

// Elections reports how many times this sampler became the lead of its metric set or
// stopped being it.
func (s *Sampler) Elections() uint64 { return s.elections.Load() }

// SampleOnce runs one round now, connecting if needed (regardless of the
// reconnect backoff), and returns the failed reads joined. It is used at
// start-up and by tests; with no metric configured it does nothing.
func (s *Sampler) SampleOnce(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.life, cancel)()
	_, err := s.round(ctx, true)
	return err
}

// loop is the sampling goroutine: a round whenever the metric set or the
// election changes, then one per interval while there is a metric to read (a
// follower polls on the schedule [Sampler.followIn] sets). It sleeps while
// there is none.
func (s *Sampler) loop() {
	defer close(s.done)
	timer := time.NewTimer(0)
	defer timer.Stop()
	var tc <-chan time.Time // nil while there is nothing to read
	for {
		start := time.Now()
		next, _ := s.round(s.life, false) // failures are logged and published
		tc = nil
		if next > 0 {
			timer.Reset(max(next-time.Since(start), 0))
			tc = timer.C
		}
		select {
		case <-s.life.Done():
			return
		case <-s.wake:
		case <-tc:
		}
	}
}

// setup returns the metric set and the election of a round.
func (s *Sampler) setup() (*config, Election) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg, s.election
}

func (s *Sampler) config() *config {
	cfg, _ := s.setup()
	return cfg
}

// minElectTimeout is the shortest time an election call may take before the
// sampler samples for itself: shorter than a loaded Redis's round trip, it
// would turn every follower into a sampler.
const minElectTimeout = 50 * time.Millisecond

// electTimeout bounds each election call as a read is bounded: a hung Redis
// still leaves the round time to read the server itself.
func (s *Sampler) electTimeout() time.Duration { return max(s.timeout, minElectTimeout) }

// round runs one round and returns when the next is due (0: when woken). With
// force it connects even while the reconnect backoff runs. With an election,
// it votes first: a follower adopts the published sample, the lead (or a
// sampler whose election could not be held) reads the server, and the lead
// publishes what it read.
func (s *Sampler) round(ctx context.Context, force bool) (next time.Duration, err error) {
	t, err := s.sess.take(ctx)
	if err != nil {
		return s.interval, err
	}
	defer s.sess.give(t)
	if s.life.Err() != nil {
		return 0, errClosed // Close has run (or is closing the connection): open nothing
	}
	cfg, el := s.setup()
	b := Ballot{Set: cfg.set, Interval: s.interval}
	if t.el != nil && (t.el != el || t.lead != b || len(cfg.order) == 0) {
		s.resign(ctx, t) // the lease of a set or an election no longer in use
	}
	if len(cfg.order) == 0 {
		return 0, t.closeConn()
	}
	lead := false
	if el != nil {
		v, ok := s.vote(ctx, t, el, b)
		if !ok && t.follows && s.fresh(cfg, LeaseIntervals*s.interval) {
			// One failed call is no outage: a follower whose sample is young polls again
			// soon, and samples for itself only before its readings would go stale.
			return s.interval / 4, nil
		}
		if !ok {
			t.follows = false // from now on it samples every interval, until a vote answers
		}
		if ok && !v.Lead {
			// A follower reads nothing from the server: its connection is not needed.
			if err := t.closeConn(); err != nil {
				s.log.Debug("health: closing the sampler connection", "error", err)
			}
			results := adopt(v, cfg, s.now(), s.interval)
			s.publish(results)
			return s.followIn(results), nil
		}
		lead = ok
	}
	err = s.sample(ctx, t, force, cfg)
	switch {
	case !lead:
	case s.fresh(cfg, s.interval):
		s.share(ctx, el, b, cfg)
	default:
		// A lead that cannot read the server (its connection cut, its role refused, a query
		// failing) must not keep the lease: it publishes nothing, so the followers' readings
		// would age into staleness for as long as it lives. It resigns, and another instance, whose round comes
		// within the interval, takes the lease and reads the server itself.
		s.resign(ctx, t)
	}
	return s.interval, err
}

// vote holds the election of b; ok is false when it could not be held (the
// sampler then samples for itself and logs it once). It records in t whether
// this sampler leads, counting the changes.
func (s *Sampler) vote(ctx context.Context, t *turn, el Election, b Ballot) (v Vote, ok bool) {
	ectx, cancel := context.WithTimeout(ctx, s.electTimeout())
	v, err := el.Elect(ectx, b)
	cancel()
	if err != nil {
		// Logged once when the election starts failing, not at each new error text: a hung
		// Redis answers by turns with a deadline, an i/o timeout and a call still outstanding.
		if ctx.Err() == nil && t.electErr == "" && !errors.Is(err, ErrNotReady) {
			t.electErr = err.Error()
			s.log.Warn("health: the sampler election cannot be held; this instance samples for itself", "error", err)
		}
		return Vote{}, false
	}
	if t.electErr != "" {
		t.electErr = ""
		s.log.Info("health: the sampler election is held again")
	}
	if v.Lead != (t.el != nil) {
		s.elections.Add(1)
		s.log.Debug("health: sampler election changed", "lead", v.Lead)
	}
	t.lead, t.el, t.follows = Ballot{}, nil, !v.Lead
	if v.Lead {
		t.lead, t.el = b, el
	}
	return v, true
}

// fresh reports whether every metric of cfg has a good reading younger than age.
func (s *Sampler) fresh(cfg *config, age time.Duration) bool {
	readings, now := s.snap.Load().readings, s.now()
	for _, m := range cfg.order {
		r, ok := readings[m]
		if !ok || !r.good || r.err != "" || now.Sub(r.at) >= age {
			return false
		}
	}
	return true
}

// resign gives up the lease t holds, within the election timeout. A call that fails leaves
// t leading: the lease is still this instance's until it lapses, and the next round, or
// Close, resigns it again (a round cut off by Close, its context cancelled, sends nothing).
func (s *Sampler) resign(ctx context.Context, t *turn) {
	ctx, cancel := context.WithTimeout(ctx, s.electTimeout())
	defer cancel()
	if err := t.el.Resign(ctx, t.lead); err != nil {
		return
	}
	t.lead, t.el = Ballot{}, nil
	s.elections.Add(1)
}

// share publishes, as the lead, the readings of the round that just ended.
// A failure is not logged: followers' readings then age, and the next vote
// reports an unreachable Redis.
func (s *Sampler) share(ctx context.Context, el Election, b Ballot, cfg *config) {
	ctx, cancel := context.WithTimeout(ctx, s.electTimeout())
	defer cancel()
	if err := el.Publish(ctx, b, toShare(s.snap.Load().readings, cfg, s.now())); err != nil {
		s.log.Debug("health: publishing the sample failed", "error", err)
	}
}

// followIn is how long a follower waits before its next poll: until shortly
// after the lead's next sample is due (one interval after the newest it
// adopted), but at least a quarter and at most one interval. When the sample
// is overdue (the lead is late, or gone and its lease about to lapse) it
// polls every quarter interval, so that a new lead's first sample, or its own
// takeover, is not missed by a whole interval.
func (s *Sampler) followIn(results []result) time.Duration {
	var newest time.Time
	for _, r := range results {
		if r.err == "" && r.at.After(newest) {
			newest = r.at
		}
	}
	poll := s.interval / 4
	if newest.IsZero() {
		return poll
	}
	due := newest.Add(s.interval + s.interval/8).Sub(s.now())
	return min(max(due, poll), s.interval)
}

// sample reads the metrics of cfg on the dedicated connection and publishes
// the results; it returns the failed reads joined. The metrics whose last read
// did not fail are read first, then those whose last read failed, the least
// recently tried first (readOrder), while the round is within its interval
// (and the first of those that failed in any case). A read that times out
// takes most of its timeout, so a few failing queries would otherwise make a
// round last intervals and keep a healthy metric from being read until it went
// stale; a metric not reached keeps its state, its last good sample counting
// until it is too old, and is read in a later round.
func (s *Sampler) sample(ctx context.Context, t *turn, force bool, cfg *config) error {
	conn, err := s.open(ctx, t, force, cfg)
	if err != nil {
		return err
	}
	results := make([]result, 0, len(cfg.order))
	var errs []error
	start := s.now()
	order, ok := s.readOrder(cfg, t)
	for i, m := range order {
		if i > 0 && i != ok && s.now().Sub(start) >= s.interval {
			// The round has read for an interval: the rest waits for a later one, all but
			// the first metric whose last read failed, which each round tries.
			break
		}
		sql := cfg.defs[m]
		at := s.now()
		t.tried[m] = at
		rctx, cancel := context.WithTimeout(ctx, s.timeout)
		v, err := conn.ReadNumber(rctx, sql)
		cancel()
		switch {
		case m == vocab.MetricReplicationLag && errors.Is(err, ErrNull):
			err = errLagUnknown
		case m == vocab.MetricActiveQueries && errors.Is(err, ErrNoRows):
			err = errActiveHidden
		}
		if ctx.Err() != nil {
			// Closing, or the caller gave up: this is not the server's fault.
			if conn.IsClosed() {
				t.conn = nil
			}
			return ctx.Err()
		}
		res := result{metric: m, sql: sql, value: v, at: at}
		if err != nil {
			res.err, res.report = describe(err, s.timeout), true
			errs = append(errs, &readError{metric: m, reason: res.err, err: err})
		}
		results = append(results, res)
		if conn.IsClosed() {
			// The read broke the connection (a client-side timeout or a
			// terminated backend): the rest cannot be read on it.
			t.conn = nil
			for _, rest := range order[i+1:] {
				results = append(results, result{metric: rest, sql: cfg.defs[rest], err: errConnLost})
			}
			break
		}
	}
	s.publish(results)
	return errors.Join(errs...)
}

// readOrder is the order in which a round reads the metrics of cfg, and how
// many lead it: those whose last read did not fail, in cfg's order, then those
// whose last read failed, the least recently tried first (t.tried, which it
// rids of the metrics cfg no longer reads).
func (s *Sampler) readOrder(cfg *config, t *turn) (order []string, ok int) {
	if t.tried == nil {
		t.tried = map[string]time.Time{}
	}
	for m := range t.tried {
		if _, in := cfg.defs[m]; !in {
			delete(t.tried, m)
		}
	}
	readings := s.snap.Load().readings
	order = make([]string, 0, len(cfg.order))
	var failed []string
	for _, m := range cfg.order {
		if readings[m].err != "" {
			failed = append(failed, m)
		} else {
			order = append(order, m)
		}
	}
	slices.SortStableFunc(failed, func(a, b string) int { return t.tried[a].Compare(t.tried[b]) })
	return append(order, failed...), len(order)
}

// open returns the open connection, or opens one. A failed connect
// marks every metric failed and schedules the next attempt.
func (s *Sampler) open(ctx context.Context, t *turn, force bool, cfg *config) (Conn, error) {
	if t.conn != nil && !t.conn.IsClosed() {
		return t.conn, nil
	}
	t.conn = nil
	now := s.now()
	if !force && now.Before(t.retryAt) {
		return nil, errWaiting
	}
	conn, err := s.dial(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		t.failures++
		t.retryAt = now.Add(reconnectDelay(t.failures, s.interval, rand.Float64()))
		desc := describe(err, s.connectTimeout)
		results := make([]result, 0, len(cfg.order)+1)
		results = append(results, result{metric: connectKey, err: desc, report: true, at: t.retryAt})
		for _, m := range cfg.order {
			results = append(results, result{metric: m, sql: cfg.defs[m], err: errNotConnected})
		}
		s.publish(results)
		return nil, &readError{metric: "connect", reason: desc, err: err}
	}
	t.conn, t.failures, t.retryAt = conn, 0, time.Time{}
	s.publish([]result{{metric: connectKey}})
	return conn, nil
}

// dial opens and names the dedicated connection.
func (s *Sampler) dial(ctx context.Context) (Conn, error) {
	if s.connect == nil {
		return nil, errors.New("health: Options.Connect is nil")
	}
	ctx, cancel := context.WithTimeout(ctx, s.connectTimeout)
	defer cancel()
	conn, err := s.connect(ctx)
	if err != nil {
		return nil, err
	}
	ms := max(1, (s.timeout - s.timeout/3).Milliseconds())
	if err := conn.Exec(ctx, setupSQL, ApplicationName, strconv.FormatInt(ms, 10)); err != nil {
		closeConn(conn)
		return nil, err
	}
	return conn, nil
}

// take waits until no other round holds the session and returns its turn,
// which the caller gives back. It holds the lock only to hand the turn over.
func (ss *session) take(ctx context.Context) (*turn, error) {
	for {
		ss.mu.Lock()
		if !ss.busy {
			ss.busy, ss.ended = true, make(chan struct{})
			t := ss.t
			ss.t.conn = nil
			ss.mu.Unlock()
			return &t, nil
		}
		ended := ss.ended
		ss.mu.Unlock()
		select {
		case <-ended:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// give ends a round: t becomes the session's state again, and its connection
// is closed (outside the lock) if a close was asked for meanwhile.
func (ss *session) give(t *turn) {
	ss.mu.Lock()
	var stale Conn
	if ss.closing {
		stale, t.conn, ss.closing = t.conn, nil, false
	}
	ss.t, ss.busy = *t, false
	close(ss.ended)
	ss.mu.Unlock()
	if stale != nil {
		_ = closeConn(stale)
	}
}

// close closes the connection, if open; while a round holds it, that round
// closes it when it ends, and close does not wait.
func (ss *session) close() error {
	ss.mu.Lock()
	if ss.busy {
		ss.closing = true
		ss.mu.Unlock()
		return nil
	}
	conn := ss.t.conn
	ss.t.conn = nil
	ss.mu.Unlock()
	if conn == nil {
		return nil
	}
	return closeConn(conn)
}

// leading returns the ballot whose lease the last round held and its
// election; el is nil when it held none or a round is in progress.
func (ss *session) leading() (Ballot, Election) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.busy {
		return Ballot{}, nil
	}
	return ss.t.lead, ss.t.el
}

// closeConn closes the turn's connection, if open.
func (t *turn) closeConn() error {
	if t.conn == nil {
		return nil
	}
	err := closeConn(t.conn)
	t.conn = nil
	return err
}

func closeConn(conn Conn) error {
	ctx, cancel := context.WithTimeout(context.Background(), CloseTimeout)
	defer cancel()
	return conn.Close(ctx)
}

// publish folds a round's results into a new snapshot, counts failures and
// logs each change of error and each recovery. Results for metrics that were
// reconfigured during the round are dropped.
func (s *Sampler) publish(results []result) {
	type entry struct {
		level slog.Level
		msg   string
		attrs []any
	}
	var logs []entry

	s.mu.Lock()
	next := maps.Clone(s.snap.Load().readings)
	for _, res := range results {
		if res.metric == connectKey {
			switch {
			case res.err != "":
				s.errors.Add(1)
				if res.err != s.connErr {
					logs = append(logs, entry{slog.LevelWarn, "health: connect failed; each health metric counts as stale once its last good sample is too old",
						[]any{"error", res.err, "retry_at", res.at}})
				}
			case s.connErr != "":
				logs = append(logs, entry{slog.LevelInfo, "health: connected again", nil})
			}
			s.connErr = res.err
			continue
		}
		r, ok := next[res.metric]
		if !ok || r.sql != res.sql {
			continue
		}
		if res.err != "" {
			if res.report {
				s.errors.Add(1)
				if res.err != r.err && s.logFailure(res.err) {
					logs = append(logs, entry{slog.LevelWarn, "health: metric read failed; its last good sample stands until it is too old",
						[]any{"metric", res.metric, "error", res.err}})
				}
			}
			r.err = res.err
			next[res.metric] = r
			continue
		}
		if res.shared && r.good && res.at.Before(r.at.Add(s.interval/8)) {
			// Not newer than the reading held: the sample adopted last time, read again (its
			// date moves only by the drift between this clock and Redis's: a lead publishes
			// once an interval), or an older one that a writer of Redis put back, which must
			// not replace a newer reading (and lift the limit it holds).
			continue
		}
		if r.staleLogged.Swap(false) || r.err != "" && r.err != errNotConnected && r.err != errConnLost &&
			r.err != errActiveHidden.Problem {
			logs = append(logs, entry{slog.LevelInfo, "health: metric read again", []any{"metric", res.metric}})
		}
		if res.shared {
			s.shared.Add(1)
		} else {
			s.samples.Add(1)
		}
		r.value, r.at, r.good, r.err, r.interval = res.value, res.at, true, "", s.interval
		next[res.metric] = r
	}
	s.store(next)
	s.mu.Unlock()

	for _, e := range logs {
		s.log.Log(context.Background(), e.level, e.msg, e.attrs...)
	}
}

// logFailure reports whether a read that failed as desc says, after a good read or another
// error, is logged. Every such change is, but for errActiveHidden only the first: it comes
// and goes with other roles' statements, and one line says what to grant (its recoveries are
// not logged either; the staleness it causes is, as any).
func (s *Sampler) logFailure(desc string) bool {
	return desc != errActiveHidden.Problem || !s.hiddenLogged.Swap(true)
}
