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

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

const (
	// ApplicationName is the sampler connection's application_name, so that
	// it can be told apart in pg_stat_activity.
	ApplicationName = "pgtraffic-health"
	// StaleIntervals is how many intervals old a sample may be before it is stale.
	StaleIntervals = 3

	minConnectTimeout = 5 * time.Second
	closeTimeout      = time.Second
	connectKey        = "(connect)" // error-tracking key of the connection itself
)

var errClosed = errors.New("health: sampler closed")

// errWaiting means a round was skipped because the reconnect backoff has not
// elapsed; the readings stay marked failed from the connect that failed.
var errWaiting = errors.New("health: waiting to reconnect")

// Options configures a [Sampler]. Every field but Connect has a default.
type Options struct {
	// Connect opens the dedicated connection; the engine passes
	// pgx.ConnectConfig with the connector's config. The sampler bounds ctx
	// and then names the session [ApplicationName].
	Connect func(ctx context.Context) (*pgx.Conn, error)
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
	// change; default slog.Default().
	Logger *slog.Logger
	// Now is the clock used to timestamp samples; default time.Now.
	Now func() time.Time
}

// Sampler reads server health metrics on a dedicated connection and serves
// the last sample to throttle checks.
//
// One goroutine (started by [Sampler.Start]) runs a round per interval; each
// round reads every configured metric, bounded by the timeout, and publishes
// an immutable snapshot through an atomic pointer. [Sampler.Value] and
// [Sampler.Evaluate] only load that pointer, so they never wait for I/O.
// Rounds never overlap: the loop and [Sampler.SampleOnce] take turns on the
// connection.
//
// A Sampler is created by [NewSampler]; its zero value is not usable. It is
// safe for concurrent use. [Sampler.Close] releases the goroutine and the
// connection.
type Sampler struct {
	connect        func(context.Context) (*pgx.Conn, error)
	interval       time.Duration
	timeout        time.Duration
	connectTimeout time.Duration
	log            *slog.Logger
	now            func() time.Time

	snap         atomic.Pointer[snapshot]
	errors       atomic.Uint64
	samples      atomic.Uint64 // good metric reads
	unconfigured sync.Map      // metric -> struct{}: thresholds already logged as not sampled

	life context.Context // canceled by Close; parent of all I/O
	kill context.CancelFunc
	wake chan struct{} // buffered(1): the metric set changed
	done chan struct{} // closed when the loop returns

	sess session

	mu      sync.Mutex // protects the fields below and serialises snapshot publication
	cfg     *config
	connErr string // the connect error last logged, "" when connected
	started bool
	closed  bool
}

// session is the dedicated connection.
type session struct {
	mu       sync.Mutex // protects the fields below; held for a whole round, so rounds never overlap
	conn     *pgx.Conn
	failures int       // consecutive failed connects
	retryAt  time.Time // no loop round connects before this
}

// config is an immutable metric set.
type config struct {
	defs  map[string]string // readable metric -> SQL
	order []string          // keys of defs, sorted: rounds read in a stable order
}

// snapshot is an immutable set of readings, one per configured metric.
type snapshot struct {
	readings map[string]reading
	// replaced is closed when the next snapshot replaces this one (see Published).
	replaced chan struct{}
}

// store publishes readings as the new snapshot and closes the old one's replaced channel, so
// that a statement waiting for health tries again the moment a sample arrives. The caller
// holds s.mu (or owns s alone).
func (s *Sampler) store(readings map[string]reading) {
	old := s.snap.Swap(&snapshot{readings: readings, replaced: make(chan struct{})})
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
	err   string    // why the most recent read failed; "" after a good read
	since time.Time // when the metric was configured: before its first read it is not stale
	// until it has gone unread for StaleIntervals intervals since then
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
	s.store(map[string]reading{})
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
// metrics that keep their name and query survive; a metric that cannot be
// read (unknown name, custom metric without a query) is logged, counted and
// stays stale. An empty set stops sampling and closes the connection before
// SetMetrics returns (waiting for a round in progress, which the timeout
// bounds).
func (s *Sampler) SetMetrics(metrics []string, queries map[string]string) {
	cfg, bad := buildConfig(metrics, queries)
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
		if r, ok := old[m]; ok && r.sql == sql {
			next[m] = r
			continue
		}
		next[m] = reading{sql: sql, since: s.now(), staleLogged: new(atomic.Bool)}
	}
	for m, why := range bad {
		next[m] = reading{err: why, staleLogged: new(atomic.Bool)}
	}
	s.store(next)
}

// buildConfig resolves metric names to SQL; bad maps each metric that cannot
// be read to the reason.
func buildConfig(metrics []string, queries map[string]string) (cfg *config, bad map[string]string) {
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

// SampleOnce runs one round now, connecting if needed (regardless of the
// reconnect backoff), and returns the failed reads joined. It is used at
// start-up and by tests; with no metric configured it does nothing.
func (s *Sampler) SampleOnce(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.life, cancel)()
	return s.round(ctx, true)
}

// loop is the sampling goroutine: a round whenever the metric set changes
// and on each tick while there is a metric to read. The ticker is stopped
// while there is none.
func (s *Sampler) loop() {
	defer close(s.done)
	var tick *time.Ticker
	var tc <-chan time.Time
	defer func() {
		if tick != nil {
			tick.Stop()
		}
	}()
	changed := true
	for {
		if len(s.config().order) > 0 {
			if tick == nil {
				tick = time.NewTicker(s.interval)
				tc = tick.C
			}
			if changed {
				_ = s.round(s.life, false) // failures are logged and published
			}
		} else if tick != nil {
			tick.Stop()
			tick, tc = nil, nil
		}
		changed = false
		select {
		case <-s.life.Done():
			return
		case <-s.wake:
			changed = true
		case <-tc:
			_ = s.round(s.life, false)
		}
	}
}

func (s *Sampler) config() *config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg
}

// round reads every configured metric once and publishes the results. With
// force it connects even while the reconnect backoff runs.
func (s *Sampler) round(ctx context.Context, force bool) error {
	s.sess.mu.Lock()
	defer s.sess.mu.Unlock()
	if s.life.Err() != nil {
		return errClosed // Close has run (or is closing the connection): open nothing
	}
	cfg := s.config()
	if len(cfg.order) == 0 {
		return s.sess.closeLocked()
	}
	conn, err := s.connLocked(ctx, force, cfg)
	if err != nil {
		return err
	}

	results := make([]result, 0, len(cfg.order))
	var errs []error
	for i, m := range cfg.order {
		sql := cfg.defs[m]
		at := s.now()
		rctx, cancel := context.WithTimeout(ctx, s.timeout)
		v, err := readNumber(rctx, conn, sql)
		cancel()
		if m == vocab.MetricReplicationLag && errors.Is(err, errNull) {
			err = errLagUnknown
		}
		if ctx.Err() != nil {
			// Closing, or the caller gave up: this is not the server's fault.
			if conn.IsClosed() {
				s.sess.conn = nil
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
			s.sess.conn = nil
			for _, rest := range cfg.order[i+1:] {
				results = append(results, result{metric: rest, sql: cfg.defs[rest], err: "connection lost"})
			}
			break
		}
	}
	s.publish(results)
	return errors.Join(errs...)
}

// connLocked returns the open connection, or opens one. A failed connect
// marks every metric failed and schedules the next attempt.
func (s *Sampler) connLocked(ctx context.Context, force bool, cfg *config) (*pgx.Conn, error) {
	ss := &s.sess
	if ss.conn != nil && !ss.conn.IsClosed() {
		return ss.conn, nil
	}
	ss.conn = nil
	now := s.now()
	if !force && now.Before(ss.retryAt) {
		return nil, errWaiting
	}
	conn, err := s.dial(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		ss.failures++
		ss.retryAt = now.Add(reconnectDelay(ss.failures, s.interval, rand.Float64()))
		desc := describe(err, s.connectTimeout)
		results := make([]result, 0, len(cfg.order)+1)
		results = append(results, result{metric: connectKey, err: desc, report: true, at: ss.retryAt})
		for _, m := range cfg.order {
			results = append(results, result{metric: m, sql: cfg.defs[m], err: "not connected"})
		}
		s.publish(results)
		return nil, &readError{metric: "connect", reason: desc, err: err}
	}
	ss.conn, ss.failures, ss.retryAt = conn, 0, time.Time{}
	s.publish([]result{{metric: connectKey}})
	return conn, nil
}

// dial opens and names the dedicated connection.
func (s *Sampler) dial(ctx context.Context) (*pgx.Conn, error) {
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
	if _, err := conn.Exec(ctx, setupSQL, ApplicationName, strconv.FormatInt(ms, 10)); err != nil {
		closeConn(conn)
		return nil, err
	}
	return conn, nil
}

// close closes the connection, if open, once a round in progress has ended.
func (ss *session) close() error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.closeLocked()
}

// closeLocked closes the connection, if open. The caller holds ss.mu.
func (ss *session) closeLocked() error {
	if ss.conn == nil {
		return nil
	}
	err := closeConn(ss.conn)
	ss.conn = nil
	return err
}

func closeConn(conn *pgx.Conn) error {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
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
					logs = append(logs, entry{slog.LevelWarn, "health: connect failed; every health metric counts as stale",
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
				if res.err != r.err {
					logs = append(logs, entry{slog.LevelWarn, "health: metric read failed; it counts as stale until a good read",
						[]any{"metric", res.metric, "error", res.err}})
				}
			}
			r.err = res.err
			next[res.metric] = r
			continue
		}
		if r.staleLogged.Swap(false) || r.err != "" && r.err != "not connected" && r.err != "connection lost" {
			logs = append(logs, entry{slog.LevelInfo, "health: metric read again", []any{"metric", res.metric}})
		}
		s.samples.Add(1)
		r.value, r.at, r.good, r.err = res.value, res.at, true, ""
		next[res.metric] = r
	}
	s.store(next)
	s.mu.Unlock()

	for _, e := range logs {
		s.log.Log(context.Background(), e.level, e.msg, e.attrs...)
	}
}
