package serverclock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/internal/health"
)

// ErrUnavailable is wrapped by a Conn's error when the server says pg_stat_statements cannot be
// read at all (not installed in the database, not loaded, not visible to the role): retrying at
// once would fail the same way.
var ErrUnavailable = errors.New("serverclock: pg_stat_statements is not available")

// ErrNoQueryID is the error of a round that finds statements explained but none with a query
// identifier: the server computes none, so pg_stat_statements cannot say what a pattern cost.
var ErrNoQueryID = errors.New("serverclock: the server reports no query identifier for the explained statements " +
	"(PostgreSQL 14 or later with compute_query_id = on, or auto with pg_stat_statements in shared_preload_libraries), " +
	"or they run under pgx's simple protocol, whose identifiers EXPLAIN cannot tell")

// ApplicationName is the reader connection's application_name, so that it can be told apart
// in pg_stat_activity.
const ApplicationName = "pgtraffic server clock"

const (
	// StatementTimeout is the reader connection's statement_timeout (a setting's text): the
	// server ends a read that takes longer.
	StatementTimeout = "500ms"
	// MaxQueryIDs bounds one read: the identifiers of at most this many patterns, the most
	// recently used first.
	MaxQueryIDs = 1000
	// reportIntervals is how many intervals a pattern's server-clock prediction stays in force
	// without a newer report (its entry gone from the view, failing reads) before it returns to
	// the client's clock. An idle pattern is reported at every read (tracker.update).
	reportIntervals = 10
	// floorPings is how many recent round trips the network floor is the smallest of; once that
	// many are measured, a round trip is measured every pingEvery rounds. The first round
	// measures firstPings at once: the floor is taken off every statement's time, and one round
	// trip alone, slowed by a loaded machine, could take most of a statement's time off it.
	floorPings = 16
	pingEvery  = 8
	firstPings = 3
	// unavailableFailures is the count of failed rounds that the first ErrUnavailable counts
	// as: the next attempt waits the longest backoff.
	unavailableFailures = 7
	// maxBackoff bounds the wait after failed rounds, which doubles from one interval: a
	// missing extension costs a failed read every 64 intervals, not every interval.
	maxBackoff = 64
	// minRoundTimeout bounds a round (a connect, a round trip and a read) when the interval is
	// shorter: a round that overruns only delays the next one, and the server ends a read
	// after StatementTimeout anyway.
	minRoundTimeout = 2 * time.Second
)

// Sink is what a Reader teaches: the engine.
type Sink interface {
	// QueryIDs appends to dst the patterns whose query identifier is known, at most max.
	QueryIDs(dst []cost.QueryID, max int) []cost.QueryID
	// ObserveServer hands pattern fp's mean server seconds per execution (query identifier
	// id) over the recent reads, weighted by their calls (Learned), for predictions until
	// until. cost.ErrImplausible: the Sink's own measurements rule the mean out (the reader
	// counts it rejected); another error: not taken (the pattern is gone).
	ObserveServer(fp uint64, id int64, seconds float64, until time.Time) error
	// SetNetworkFloor hands the smallest recent round trip to the server.
	SetNetworkFloor(d time.Duration)
	// Reading tells that the server's clock is read (started, read, a shared reading adopted,
	// or nothing to read yet): until until, the patterns whose query identifier is known will
	// be reported within about within of running. The zero until tells that a read failed:
	// nothing will be.
	Reading(until time.Time, within time.Duration)
	// Unidentified counts the EXPLAINs that reported no query identifier: while QueryIDs
	// knows none, a round that finds some fails with [ErrNoQueryID], counted and logged as a
	// failed read, rather than waiting for identifiers that will not come.
	Unidentified() uint64
}

// Options configure a Reader.
type Options struct {
	Connect  func(ctx context.Context) (Conn, error) // opens the reader's own connection
	Sink     Sink
	Interval time.Duration // between reads; <= 0 is [vocab.DefaultHealthInterval]
	Logger   *slog.Logger
	Now      func() time.Time // the Sink's clock, for ObserveServer's until; nil is time.Now
	// Election, when set, shares one read per database among the instances that coordinate
	// through Redis (the health sampler's election, under a set of its own): the instance
	// holding the lease reads pg_stat_statements and publishes what it learned, the others
	// adopt it for the query identifiers they know. Nil: this instance reads for itself.
	Election health.Election
	// Previous is the reader this one replaces (a reload changed the interval or the
	// election), which its owner closes: this one starts once it has stopped, from its
	// baselines and averages, so that the patterns it reported stay on the server's clock
	// without a gap of two of the new intervals. Nil: the reader starts afresh.
	Previous *Reader
}

// electionSet names the server clock's lease and sample in the election, apart from every
// health metric set.
const electionSet = "pgtraffic server clock"

// sharedPrefix begins a published reading's name: the query identifier follows.
const sharedPrefix = "queryid:"

// Reader reads the server's clock in the background (see the package documentation). Its
// methods are safe for concurrent use. The zero value is not usable; use [NewReader].
type Reader struct {
	o     Options
	life  context.Context
	kill  context.CancelFunc
	done  chan struct{}
	start sync.Once
	stop  sync.Once

	reads, failures, resets, rejected, shared atomic.Uint64

	// The loop's own state, touched by its goroutine only.
	conn   Conn
	tr     tracker
	pings  [floorPings]time.Duration
	npings int
	rounds int
	failed int // consecutive failed rounds: the first one's cause is logged, the next ones are not
}

// NewReader returns a reader for o. It does nothing until Start.
func NewReader(o Options) *Reader {
	if o.Interval <= 0 {
		o.Interval = vocab.DefaultHealthInterval
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	r := &Reader{o: o, done: make(chan struct{}), tr: tracker{maxAge: reportIntervals * o.Interval}}
	r.life, r.kill = context.WithCancel(context.Background())
	return r
}

// Start starts the reading goroutine; later calls do nothing.
func (r *Reader) Start() {
	r.start.Do(func() {
		// Read from now on, unless the first round fails: the statements that run before it are
		// reported once it reads.
		r.o.Sink.Reading(r.o.Now().Add(reportIntervals*r.o.Interval), r.reportWithin())
		go r.loop()
	})
}

// reportWithin is how long after a statement its pattern's report comes at the latest: two
// rounds, for the first read that sees a new query identifier only takes its baseline.
func (r *Reader) reportWithin() time.Duration { return 2 * r.o.Interval }

// Close stops the goroutine, waits for it and closes the connection. Later calls return nil.
func (r *Reader) Close() error {
	var err error
	r.stop.Do(func() {
		r.kill()
		started := true
		r.start.Do(func() { started = false; close(r.done) })
		<-r.done
		if started && r.o.Election != nil {
			// Hand the lease over now rather than when it lapses; an error is harmless.
			ctx, cancel := context.WithTimeout(context.Background(), r.o.Interval)
			_ = r.o.Election.Resign(ctx, health.Ballot{Set: electionSet, Interval: r.o.Interval})
			cancel()
		}
		if started && r.conn != nil {
			ctx, cancel := context.WithTimeout(context.Background(), r.o.Interval)
			defer cancel()
			err = r.conn.Close(ctx)
		}
	})
	return err
}

// Counts are a Reader's event counts since it was made.
type Counts struct {
	Reads    uint64 // reads of pg_stat_statements that succeeded
	Failures uint64 // failed connects, round trips and reads, and rounds with no query identifier to read
	Resets   uint64 // counters found reset, evicted or gone, whose read taught nothing
	Rejected uint64 // rows that made no sense (negative, not finite, duplicated, absurd)
	Shared   uint64 // rounds that adopted what the instance elected for the database read
}

// Counts returns r's counts.
func (r *Reader) Counts() Counts {
	return Counts{Reads: r.reads.Load(), Failures: r.failures.Load(), Resets: r.resets.Load(),
		Rejected: r.rejected.Load(), Shared: r.shared.Load()}
}

func (r *Reader) loop() {
	defer close(r.done)
	if prev := r.o.Previous; prev != nil {
		select {
		case <-prev.done:
			r.tr = prev.tr // its goroutine is done with it
			r.tr.maxAge = reportIntervals * r.o.Interval
		case <-r.life.Done():
			return
		}
		r.o.Previous = nil // let it go
	}
	t := time.NewTimer(0)
	defer t.Stop()
	var due time.Time // when the next round is
	for {
		select {
		case <-r.life.Done():
			return
		case <-t.C:
		}
		begun := time.Now()
		if begun.Before(due) {
			// Waiting after failed rounds (without pg_stat_statements, 64 intervals): the round
			// trips keep their schedule, for the client's clock takes the floor off every
			// statement, and round trips slowed at the start must not stay the floor meanwhile.
			r.measureHeld(r.life)
		} else {
			r.Round(r.life)
			wait := r.o.Interval
			if r.failed > 0 {
				wait *= time.Duration(min(1<<min(r.failed-1, 30), maxBackoff))
			}
			due = begun.Add(wait)
		}
		t.Reset(max(r.o.Interval-time.Since(begun), 0))
	}
}

// measureHeld measures round trips on the connection the reader holds, if it holds one that is
// open, as their schedule says (measure); nothing else. A failure is left to the next round,
// which reconnects.
func (r *Reader) measureHeld(ctx context.Context) {
	if r.conn == nil || r.conn.IsClosed() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, max(r.o.Interval, minRoundTimeout))
	defer cancel()
	_ = r.measure(ctx)
}

// measure counts a round and, as the schedule says (every round until floorPings are
// measured, the first firstPings at once, then every pingEvery rounds), measures round trips on
// the reader's connection and sets the network floor to the smallest of the last floorPings.
func (r *Reader) measure(ctx context.Context) error {
	r.rounds++
	if r.npings >= floorPings && r.rounds%pingEvery != 0 {
		return nil
	}
	n := 1
	if r.npings == 0 {
		n = firstPings
	}
	for range n {
		t0 := time.Now()
		if err := r.conn.Ping(ctx); err != nil {
			return fmt.Errorf("serverclock: round trip: %w", err)
		}
		r.pings[r.npings%floorPings] = time.Since(t0)
		r.npings++
	}
	r.o.Sink.SetNetworkFloor(slices.Min(r.pings[:min(r.npings, floorPings)]))
	return nil
}

// Round runs one round: a round trip and a read. The loop runs one per interval, and after
// failed rounds waits twice as long each time, up to 64 intervals (at once when the server says
// pg_stat_statements is not there for this role, [ErrUnavailable]), measuring round trips
// meanwhile as their schedule says; tests run them directly. It must not run concurrently with
// itself or the loop.
func (r *Reader) Round(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, max(r.o.Interval, minRoundTimeout))
	defer cancel()
	if err := r.round(rctx); err != nil {
		r.o.Sink.Reading(time.Time{}, 0) // not read: what waited for a report keeps its charge
		r.failures.Add(1)
		if r.failed == 0 && ctx.Err() == nil {
			r.o.Logger.Warn("pgtraffic: reading the server's clock failed; costs stay on the client's clock", "error", err)
		}
		r.failed++
		if errors.Is(err, ErrUnavailable) {
			r.failed = max(r.failed, unavailableFailures)
		}
		return
	}
	if r.failed > 0 {
		r.o.Logger.Info("pgtraffic: reading the server's clock works again")
	}
	r.failed = 0
}

func (r *Reader) round(ctx context.Context) error {
	if r.conn == nil || r.conn.IsClosed() {
		if r.conn != nil {
			_ = r.conn.Close(ctx)
			r.conn = nil
		}
		if r.o.Connect == nil {
			return errors.New("serverclock: Options.Connect is nil")
		}
		c, err := r.o.Connect(ctx)
		if err != nil {
			return fmt.Errorf("serverclock: connect: %w", err)
		}
		r.conn = c
	}
	if err := r.measure(ctx); err != nil {
		return err
	}

	pairs := r.o.Sink.QueryIDs(nil, MaxQueryIDs)
	if len(pairs) == 0 && r.o.Sink.Unidentified() > 0 {
		return ErrNoQueryID
	}
	lead := false
	if el := r.o.Election; el != nil {
		b := health.Ballot{Set: electionSet, Interval: r.o.Interval}
		ectx, cancel := r.electContext(ctx)
		v, err := el.Elect(ectx, b)
		cancel()
		switch {
		case err != nil: // Redis unreachable: read for ourselves
		case v.Lead:
			lead = true
		default:
			// The elected instance reads the identifiers it knows; another service's, or the
			// patterns its own traffic has not explained, this one reads for itself.
			if pairs = r.follow(v, pairs); len(pairs) == 0 {
				return nil
			}
		}
	}
	until := r.o.Now().Add(reportIntervals * r.o.Interval)
	if len(pairs) == 0 {
		r.o.Sink.Reading(until, r.reportWithin()) // nothing to read yet: the next round reads what is learned
		return nil
	}
	byID := make(map[int64][]uint64, len(pairs)) // one identifier may serve several patterns
	ids := make([]int64, 0, len(pairs))
	for _, p := range pairs {
		if _, ok := byID[p.ID]; !ok {
			ids = append(ids, p.ID)
		}
		byID[p.ID] = append(byID[p.ID], p.Fingerprint)
	}
	reading, err := r.conn.Read(ctx, ids)
	if err != nil {
		return fmt.Errorf("serverclock: reading pg_stat_statements: %w", err)
	}
	r.reads.Add(1)
	resets, rejected := r.tr.resets, r.tr.rejected
	r.tr.keep(ids)
	learned := r.tr.update(r.o.Now(), reading, nil)
	r.resets.Add(r.tr.resets - resets)
	r.rejected.Add(r.tr.rejected - rejected)
	r.o.Sink.Reading(until, r.reportWithin())
	for _, l := range learned {
		for _, fp := range byID[l.QueryID] {
			r.observe(fp, l.QueryID, l.Seconds, until)
		}
	}
	if lead {
		r.publish(ctx, learned)
	}
	return nil
}

// observe hands the Sink pattern fp's mean seconds (query identifier id), counting one that
// its measurements rule out as rejected: read here or adopted from the elected instance, a
// pg_stat_statements that returns nonsense is untrusted input.
func (r *Reader) observe(fp uint64, id int64, seconds float64, until time.Time) {
	if errors.Is(r.o.Sink.ObserveServer(fp, id, seconds, until), cost.ErrImplausible) {
		r.rejected.Add(1)
	}
}

// publish makes learned, at most as many as a sample holds, the database's shared reading. A
// failure is not counted: the followers' copies age, and their next vote finds Redis down.
func (r *Reader) publish(ctx context.Context, learned []Learned) {
	out := make([]health.Shared, 0, min(len(learned), health.MaxSharedReadings))
	for _, l := range learned[:min(len(learned), health.MaxSharedReadings)] {
		out = append(out, health.Shared{Metric: sharedPrefix + strconv.FormatInt(l.QueryID, 10), Value: l.Seconds})
	}
	ctx, cancel := r.electContext(ctx)
	defer cancel()
	_ = r.o.Election.Publish(ctx, health.Ballot{Set: electionSet, Interval: r.o.Interval}, out)
}

// electContext bounds an election call to a quarter of the round's time left: a Redis that
// hangs, or an election not ready, leaves the round the time to read the server itself.
func (r *Reader) electContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok {
		return context.WithTimeout(ctx, time.Until(d)/4)
	}
	return context.WithTimeout(ctx, max(r.o.Interval, minRoundTimeout)/4)
}

// follow adopts, for the query identifiers of pairs, what the elected instance published, as
// untrusted input: a reading that is not a query identifier's, failed, older than the
// predictions it would keep, or not a plausible mean is rejected and counted. It returns the
// pairs whose identifiers the published reading did not hold (none when there was no
// reading to adopt: the elected instance has read nothing yet, or what it published was
// rejected), for this instance to read itself.
func (r *Reader) follow(v health.Vote, pairs []cost.QueryID) (unread []cost.QueryID) {
	if v.Bad != "" {
		r.rejected.Add(1)
		return nil
	}
	if len(v.Published) == 0 {
		return nil
	}
	published := make(map[int64]bool, len(v.Published))
	until := r.o.Now().Add(reportIntervals * r.o.Interval)
	for _, s := range v.Published {
		id, err := strconv.ParseInt(strings.TrimPrefix(s.Metric, sharedPrefix), 10, 64)
		if !strings.HasPrefix(s.Metric, sharedPrefix) || err != nil || s.Err != "" ||
			s.Age < 0 || s.Age > reportIntervals*r.o.Interval || !(s.Value >= 0) || s.Value > maxMean.Seconds() {
			r.rejected.Add(1)
			continue
		}
		published[id] = true
		for _, p := range pairs {
			if p.ID == id {
				r.observe(p.Fingerprint, id, s.Value, until)
			}
		}
	}
	r.shared.Add(1)
	r.o.Sink.Reading(until, r.reportWithin())
	for _, p := range pairs {
		if !published[p.ID] {
			unread = append(unread, p)
		}
	}
	return unread
}
