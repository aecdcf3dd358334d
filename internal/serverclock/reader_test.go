package serverclock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/internal/health"
)

type fakeConn struct {
	readings []Reading
	readErr  error
	pingErr  error
	slowPing time.Duration // the first round trip takes this long (a loaded machine)
	pings    int
	asked    [][]int64
	closed   bool
}

func (c *fakeConn) Ping(context.Context) error {
	if c.pings++; c.pings == 1 {
		time.Sleep(c.slowPing)
	}
	if c.pingErr != nil {
		c.closed = true // a failed round trip breaks a pgx connection
	}
	return c.pingErr
}

func (c *fakeConn) Read(_ context.Context, ids []int64) (Reading, error) {
	c.asked = append(c.asked, slices.Clone(ids))
	if c.readErr != nil {
		return Reading{}, c.readErr
	}
	r := c.readings[0]
	c.readings = c.readings[1:]
	return r, nil
}

func (c *fakeConn) IsClosed() bool              { return c.closed }
func (c *fakeConn) Close(context.Context) error { c.closed = true; return nil }

type observed struct {
	fp      uint64
	id      int64
	seconds float64
	until   time.Time
}

type fakeSink struct {
	ids      []cost.QueryID
	observed []observed
	floor    time.Duration
	mu       sync.Mutex // Reading may come from the reader's goroutine
	until    time.Time  // the last Reading's
	within   time.Duration
}

func (s *fakeSink) QueryIDs(dst []cost.QueryID, max int) []cost.QueryID {
	return append(dst, s.ids[:min(max, len(s.ids))]...)
}

func (s *fakeSink) ObserveServer(fp uint64, id int64, seconds float64, until time.Time) error {
	s.observed = append(s.observed, observed{fp, id, seconds, until})
	return nil
}

func (s *fakeSink) SetNetworkFloor(d time.Duration) { s.floor = d }

func (s *fakeSink) Unidentified() uint64 { return 0 }

func (s *fakeSink) Reading(until time.Time, within time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.until, s.within = until, within
}

func (s *fakeSink) reading() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.until
}

func newTestReader(connect func(context.Context) (Conn, error), sink Sink, now time.Time) *Reader {
	return NewReader(Options{Connect: connect, Sink: sink, Interval: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() time.Time { return now }})
}

func TestReaderLearnsFromTheServer(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	conn := &fakeConn{readings: []Reading{
		{Rows: []Row{{QueryID: 7, Calls: 100, ExecMS: 10}}},
		{Rows: []Row{{QueryID: 7, Calls: 300, ExecMS: 50}}},
	}}
	// Two patterns (the same statement under two search paths, say) share one identifier.
	sink := &fakeSink{ids: []cost.QueryID{{Fingerprint: 1, ID: 7}, {Fingerprint: 2, ID: 7}}}
	r := newTestReader(func(context.Context) (Conn, error) { return conn, nil }, sink, now)
	r.Round(context.Background())
	if len(sink.observed) != 0 {
		t.Fatalf("the first read taught %+v: it only takes baselines", sink.observed)
	}
	r.Round(context.Background())
	until := now.Add(reportIntervals * time.Second)
	want := []observed{{1, 7, 0.0002, until}, {2, 7, 0.0002, until}}
	if !slices.Equal(sink.observed, want) {
		t.Fatalf("observed %+v, want %+v", sink.observed, want)
	}
	if !slices.Equal(conn.asked[0], []int64{7}) {
		t.Fatalf("asked %v, want each identifier once", conn.asked[0])
	}
	if c := r.Counts(); c.Reads != 2 || c.Failures != 0 {
		t.Fatalf("counts %+v", c)
	}
	if sink.floor <= 0 {
		t.Fatal("no network floor measured")
	}
	if !sink.until.Equal(until) || sink.within != 2*time.Second {
		t.Fatalf("Reading told until %v within %v, want %v within 2s (two rounds)", sink.until, sink.within, until)
	}
}

// TestReaderSaysWhenItReads: the sink is told the reader reads from its start, until a round
// fails; the zero until says so.
func TestReaderSaysWhenItReads(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	sink := &fakeSink{ids: []cost.QueryID{{Fingerprint: 1, ID: 7}}}
	r := newTestReader(func(context.Context) (Conn, error) { return nil, errors.New("refused") }, sink, now)
	r.Start()
	defer r.Close()
	if want := now.Add(reportIntervals * time.Second); !sink.reading().Equal(want) && !sink.reading().IsZero() {
		t.Fatalf("Reading told until %v at the start, want %v", sink.reading(), want)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !sink.reading().IsZero() {
		if time.Now().After(deadline) {
			t.Fatal("a failed round did not say that the server's clock is not read")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestReaderFailuresChangeNothing(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	sink := &fakeSink{ids: []cost.QueryID{{Fingerprint: 1, ID: 7}}}
	t.Run("connect", func(t *testing.T) {
		r := newTestReader(func(context.Context) (Conn, error) { return nil, errors.New("refused") }, sink, now)
		r.Round(context.Background())
		r.Round(context.Background())
		if c := r.Counts(); c.Failures != 2 || c.Reads != 0 {
			t.Fatalf("counts %+v", c)
		}
	})
	t.Run("missing extension", func(t *testing.T) {
		conn := &fakeConn{readErr: errors.New(`relation "pg_stat_statements_info" does not exist`)}
		r := newTestReader(func(context.Context) (Conn, error) { return conn, nil }, sink, now)
		r.Round(context.Background())
		if c := r.Counts(); c.Failures != 1 || c.Reads != 0 || len(sink.observed) != 0 {
			t.Fatalf("counts %+v, observed %+v", c, sink.observed)
		}
	})
	t.Run("an unavailable extension waits the longest backoff at once", func(t *testing.T) {
		conn := &fakeConn{readErr: fmt.Errorf("%w: SQLSTATE 42P01", ErrUnavailable)}
		r := newTestReader(func(context.Context) (Conn, error) { return conn, nil }, sink, now)
		r.Round(context.Background())
		if r.failed != unavailableFailures || 1<<(r.failed-1) != maxBackoff {
			t.Fatalf("failed rounds %d, want %d (a backoff of %d intervals)", r.failed, unavailableFailures, maxBackoff)
		}
	})
	t.Run("a broken connection is replaced", func(t *testing.T) {
		conns := 0
		bad := &fakeConn{pingErr: errors.New("reset by peer")}
		good := &fakeConn{readings: []Reading{{}}}
		r := newTestReader(func(context.Context) (Conn, error) {
			conns++
			if conns == 1 {
				return bad, nil
			}
			return good, nil
		}, sink, now)
		r.Round(context.Background())
		r.Round(context.Background())
		if c := r.Counts(); c.Failures != 1 || c.Reads != 1 || conns != 2 {
			t.Fatalf("counts %+v after %d connects", c, conns)
		}
	})
	t.Run("nothing to ask", func(t *testing.T) {
		conn := &fakeConn{}
		r := newTestReader(func(context.Context) (Conn, error) { return conn, nil }, &fakeSink{}, now)
		r.Round(context.Background())
		if len(conn.asked) != 0 || r.Counts().Failures != 0 {
			t.Fatalf("asked %v with no known identifier", conn.asked)
		}
	})
}

// noIDSink is a fakeSink whose EXPLAINs reported no query identifier.
type noIDSink struct {
	fakeSink
	unidentified uint64
}

func (s *noIDSink) Unidentified() uint64 { return s.unidentified }

// TestReaderNoQueryID: statements explained without a query identifier make each round a
// failure, counted, logged once, and waiting longer each time; an identifier learned later
// makes the reads work again.
func TestReaderNoQueryID(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	conn := &fakeConn{readings: []Reading{{}}}
	sink := &noIDSink{}
	var logs bytes.Buffer
	r := NewReader(Options{Connect: func(context.Context) (Conn, error) { return conn, nil }, Sink: sink,
		Interval: time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Now: func() time.Time { return now }})
	r.Round(context.Background()) // nothing explained yet
	if c := r.Counts(); c.Failures != 0 {
		t.Fatalf("counts %+v before any EXPLAIN", c)
	}
	sink.unidentified = 3
	for range 3 {
		r.Round(context.Background())
	}
	if c := r.Counts(); c.Failures != 3 || r.failed != 3 || len(conn.asked) != 0 {
		t.Fatalf("counts %+v, failed rounds %d, asked %v", c, r.failed, conn.asked)
	}
	if n := strings.Count(logs.String(), "no query identifier"); n != 1 {
		t.Fatalf("logged %d times, want once:\n%s", n, logs.String())
	}
	sink.ids = []cost.QueryID{{Fingerprint: 1, ID: 7}}
	r.Round(context.Background())
	if c := r.Counts(); c.Reads != 1 || r.failed != 0 || !strings.Contains(logs.String(), "works again") {
		t.Fatalf("counts %+v, failed rounds %d after an identifier was learned:\n%s", c, r.failed, logs.String())
	}
}

func TestReaderCloseWithoutStart(t *testing.T) {
	r := newTestReader(nil, &fakeSink{}, time.Now())
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	r.Start() // after Close: nothing
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// fakeElection holds a vote to hand out and records what is published.
type fakeElection struct {
	vote      health.Vote
	err       error
	published []health.Shared
	resigned  bool
}

func (e *fakeElection) Elect(context.Context, health.Ballot) (health.Vote, error) {
	return e.vote, e.err
}
func (e *fakeElection) Publish(_ context.Context, _ health.Ballot, r []health.Shared) error {
	e.published = r
	return nil
}
func (e *fakeElection) Resign(context.Context, health.Ballot) error { e.resigned = true; return nil }

func TestReaderElection(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	sink := &fakeSink{ids: []cost.QueryID{{Fingerprint: 1, ID: 7}, {Fingerprint: 2, ID: 8}}}
	newReader := func(conn *fakeConn, el health.Election) *Reader {
		r := newTestReader(func(context.Context) (Conn, error) { return conn, nil }, sink, now)
		r.o.Election = el
		return r
	}
	t.Run("the lead reads and publishes", func(t *testing.T) {
		sink.observed = nil
		conn := &fakeConn{readings: []Reading{{Rows: []Row{{QueryID: 7, Calls: 1, ExecMS: 1}}}, {Rows: []Row{{QueryID: 7, Calls: 3, ExecMS: 2}}}}}
		el := &fakeElection{vote: health.Vote{Lead: true}}
		r := newReader(conn, el)
		r.Round(context.Background())
		r.Round(context.Background())
		if want := []health.Shared{{Metric: "queryid:7", Value: 0.0005}}; !slices.Equal(el.published, want) {
			t.Fatalf("published %+v, want %+v", el.published, want)
		}
		if len(sink.observed) != 1 {
			t.Fatalf("observed %+v", sink.observed)
		}
	})
	t.Run("a follower adopts, reading nothing it holds", func(t *testing.T) {
		sink.observed = nil
		conn := &fakeConn{}
		el := &fakeElection{vote: health.Vote{Published: []health.Shared{
			{Metric: "queryid:8", Value: 0.001, Age: time.Second},
			{Metric: "queryid:7", Value: 0.002},
		}}}
		r := newReader(conn, el)
		r.Round(context.Background())
		if len(sink.observed) != 2 || len(conn.asked) != 0 || r.Counts().Reads != 0 {
			t.Fatalf("observed %+v, asked %v: want both adopted and no read", sink.observed, conn.asked)
		}
	})
	t.Run("a follower reads for itself what the reading does not hold", func(t *testing.T) {
		sink.observed = nil
		conn := &fakeConn{readings: []Reading{{Rows: []Row{{QueryID: 7, Calls: 1, ExecMS: 1}}}}}
		el := &fakeElection{vote: health.Vote{Published: []health.Shared{
			{Metric: "queryid:8", Value: 0.001, Age: time.Second},
			{Metric: "queryid:9", Value: 0.001},                        // not a pattern of ours
			{Metric: "queryid:x", Value: 0.001},                        // nonsense
			{Metric: "active_queries", Value: 3},                       // not ours
			{Metric: "queryid:7", Value: -1},                           // nonsense
			{Metric: "queryid:7", Value: 0.001, Err: "failed"},         // failed
			{Metric: "queryid:7", Value: 0.001, Age: 11 * time.Second}, // too old
		}}}
		r := newReader(conn, el)
		r.Round(context.Background())
		want := []observed{{2, 8, 0.001, now.Add(reportIntervals * time.Second)}}
		if !slices.Equal(sink.observed, want) || !slices.EqualFunc(conn.asked, [][]int64{{7}}, slices.Equal) {
			t.Fatalf("observed %+v (asked %v), want %+v and a read of 7 alone (another service's pattern, "+
				"or one the elected instance has not explained: nobody else reads it)", sink.observed, conn.asked, want)
		}
		if c := r.Counts(); c.Shared != 1 || c.Rejected != 5 || c.Reads != 1 {
			t.Fatalf("counts %+v", c)
		}
		if err := r.Close(); err != nil || el.resigned {
			t.Fatalf("Close = %v, resigned %v: a reader never started has no lease to give", err, el.resigned)
		}
	})
	t.Run("without Redis each reads for itself", func(t *testing.T) {
		conn := &fakeConn{readings: []Reading{{}}}
		r := newReader(conn, &fakeElection{err: errors.New("redis down")})
		r.Round(context.Background())
		if len(conn.asked) != 1 || r.Counts().Reads != 1 {
			t.Fatalf("asked %v", conn.asked)
		}
	})
}

// TestReaderFloorNotOneRoundTrip: the network floor is never one round trip alone: the first
// round measures several, so that one slowed by a loaded machine (here the first, 50ms) does
// not become a floor that Finish takes off every statement's time.
func TestReaderFloorNotOneRoundTrip(t *testing.T) {
	conn := &fakeConn{slowPing: 50 * time.Millisecond}
	sink := &fakeSink{}
	r := newTestReader(func(context.Context) (Conn, error) { return conn, nil }, sink, time.Unix(1_700_000_000, 0))
	r.Round(context.Background())
	if conn.pings < 2 {
		t.Fatalf("the first round measured %d round trip(s)", conn.pings)
	}
	if sink.floor >= 50*time.Millisecond {
		t.Fatalf("floor %v: the one slow round trip", sink.floor)
	}
}

// TestReaderAfterFailedRounds: baselines and averages age by the clock, not by reads. After
// 20 intervals of failed rounds (the predictions lapsed long ago), a pattern that ran 1,000
// times at 1 ms before and then 100 times at 10 ms teaches nothing from the read that spans the
// gap (its growth is the whole gap's), and the read after it teaches the new 10 ms alone, not a
// blend with the average from before the gap.
func TestReaderAfterFailedRounds(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	conn := &fakeConn{readings: []Reading{
		{Rows: []Row{{QueryID: 7, Calls: 1000, ExecMS: 1000}}},
		{Rows: []Row{{QueryID: 7, Calls: 2000, ExecMS: 2000}}}, // 1000 calls at 1 ms
		{Rows: []Row{{QueryID: 7, Calls: 2100, ExecMS: 3000}}}, // after the failures: 100 calls at 10 ms
		{Rows: []Row{{QueryID: 7, Calls: 2200, ExecMS: 4000}}}, // 100 more at 10 ms
	}}
	sink := &fakeSink{ids: []cost.QueryID{{Fingerprint: 1, ID: 7}}}
	r := NewReader(Options{Connect: func(context.Context) (Conn, error) { return conn, nil }, Sink: sink,
		Interval: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() time.Time { return now }})
	round := func() {
		r.Round(context.Background())
		now = now.Add(time.Second)
	}
	round()
	round()
	conn.readErr = errors.New("canceling statement due to statement timeout")
	for range 2 * reportIntervals {
		round()
	}
	conn.readErr = nil
	sink.observed = nil
	round()
	if len(sink.observed) != 0 {
		t.Fatalf("observed %+v from the read spanning %d failed rounds, want nothing", sink.observed, 2*reportIntervals)
	}
	round()
	if c := r.Counts(); c.Failures != 2*reportIntervals || c.Reads != 4 {
		t.Fatalf("counts %+v", c)
	}
	if len(sink.observed) != 1 || math.Abs(sink.observed[0].seconds-0.010) > 1e-9 {
		t.Fatalf("observed %+v after the gap, want the new reads' own mean 10 ms", sink.observed)
	}
}

// TestReaderOneIDTwoPatterns: one query identifier serving two patterns is read once and both
// patterns learn it; an identifier listed twice for the same pattern is asked once.
func TestReaderOneIDTwoPatterns(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	conn := &fakeConn{readings: []Reading{
		{Rows: []Row{{QueryID: 7, Calls: 1, ExecMS: 1}}},
		{Rows: []Row{{QueryID: 7, Calls: 3, ExecMS: 5}}},
	}}
	sink := &fakeSink{ids: []cost.QueryID{{Fingerprint: 1, ID: 7}, {Fingerprint: 2, ID: 7}, {Fingerprint: 1, ID: 7}}}
	r := newTestReader(func(context.Context) (Conn, error) { return conn, nil }, sink, now)
	r.Round(context.Background())
	r.Round(context.Background())
	if len(conn.asked[0]) != 1 {
		t.Fatalf("asked %v", conn.asked[0])
	}
	n := map[uint64]int{}
	for _, o := range sink.observed {
		if math.Abs(o.seconds-0.002) > 1e-12 {
			t.Fatalf("observed %+v", o)
		}
		n[o.fp]++
	}
	if n[1] == 0 || n[2] == 0 {
		t.Fatalf("observed %+v: both patterns must learn", sink.observed)
	}
}
