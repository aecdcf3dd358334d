package coord

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/internal/delayproxy"
	"github.com/pgtraffic/pgtraffic/internal/health"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/internal/serverclock"
)

// countingConn is a health.Conn that counts the reads the "server" answers.
type countingConn struct {
	reads  *atomic.Int64
	closed atomic.Bool
}

func (c *countingConn) Exec(context.Context, string, ...any) error { return nil }
func (c *countingConn) ReadNumber(context.Context, string) (float64, error) {
	c.reads.Add(1)
	return 1, nil
}
func (c *countingConn) IsClosed() bool              { return c.closed.Load() }
func (c *countingConn) Close(context.Context) error { c.closed.Store(true); return nil }

// distantSampler is one instance's health sampler, with its own election built from the URL as
// the runtime builds it (clientFor), and a count of its reads of the database.
type distantSampler struct {
	s     *health.Sampler
	reads *atomic.Int64
}

func distantSamplers(t *testing.T, url string, n int, healthInterval, syncInterval time.Duration) []distantSampler {
	t.Helper()
	out := make([]distantSampler, n)
	for i := range out {
		el, err := NewElection(ElectionOptions{URL: url, SyncInterval: syncInterval, Instance: fmt.Sprintf("inst-%d", i),
			Database: electDB, Secret: secretOf(electSecret)})
		if err != nil {
			t.Fatal(err)
		}
		reads := new(atomic.Int64)
		s := health.NewSampler(health.Options{
			Connect:  func(context.Context) (health.Conn, error) { return &countingConn{reads: reads}, nil },
			Interval: healthInterval,
			Metrics:  []string{"active_queries"},
			Logger:   quiet,
			Election: el,
		})
		s.Start()
		t.Cleanup(func() { s.Close(); el.Close() })
		out[i] = distantSampler{s: s, reads: reads}
	}
	return out
}

// readsDuring returns, for a window of d, how many database reads each sampler made.
func readsDuring(ss []distantSampler, d time.Duration) []int64 {
	before := make([]int64, len(ss))
	for i, s := range ss {
		before[i] = s.reads.Load()
	}
	time.Sleep(d)
	out := make([]int64, len(ss))
	for i, s := range ss {
		out[i] = s.reads.Load() - before[i]
	}
	return out
}

// mostlyOneReader reports whether reads, the database reads of each instance over a window of
// n intervals, are those of one elected reader: at most half again one read per interval in
// all. A vote that fails now and then (a call slowed past its timeout on a loaded machine)
// costs its instance one read of its own; every instance reading for itself costs n each.
func mostlyOneReader(reads []int64, n int) bool {
	var sum int64
	for _, r := range reads {
		sum += r
	}
	return sum <= int64(n)*3/2
}

// TestElectionDistantRedisAfterStall: three health samplers of one database share an election
// through a Redis 150 ms away (75 ms each way), health_interval 500 ms (an election call's
// timeout is 250 ms) and the default sync_interval 1s (the election client's read timeout is
// 250 ms). One call fits on a warm connection; once Redis has stalled for a moment, each call
// runs on a new connection (HELLO, then EVALSHA: two round trips, 300 ms). Ended with its
// caller, every call would fail so, for good, and every instance would sample for itself; run
// on past its caller's timeout (Election.run), the call after a failure leaves a warm
// connection, and the samplers return to one reader of the database.
func TestElectionDistantRedisAfterStall(t *testing.T) {
	srv := redistest.Need(t)
	px := delayproxy.Start(t, srv.Addr, 0)
	const interval = 500 * time.Millisecond
	ss := distantSamplers(t, "redis://"+px.Addr+"/0", 3, interval, 0)
	time.Sleep(4 * interval) // warm connections, script cached
	px.SetDelay(75 * time.Millisecond)
	time.Sleep(4 * interval)
	steady := readsDuring(ss, 6*interval)
	t.Logf("steady, 150 ms away: reads per sampler in 6 intervals %v", steady)
	if !mostlyOneReader(steady, 6) {
		t.Fatalf("before any stall, reads per sampler in 6 intervals %v: want one elected reader", steady)
	}
	px.SetDelay(time.Second) // Redis stalls: the calls on their way time out
	time.Sleep(3 * interval)
	px.SetDelay(75 * time.Millisecond)
	time.Sleep(1500 * time.Millisecond) // the stalled chunks drain
	time.Sleep(4 * interval)            // a few intervals to settle
	after := readsDuring(ss, 10*interval)
	t.Logf("after a stall, 150 ms away: reads per sampler in 10 intervals %v", after)
	if !mostlyOneReader(after, 10) {
		t.Errorf("8 intervals after Redis answered again (150 ms away), the samplers still read the database for themselves (reads in 10 intervals %v), want one elected reader",
			after)
	}
}

// TestElectionDistantRedisFreshInstances: the same distance and settings as
// TestElectionDistantRedisAfterStall, but the instances start with Redis already that far:
// each one's first call is a new connection (HELLO, EVALSHA, and EVAL while Redis lacks the
// script), which does not fit the election's 250 ms. An election is held all the same, once
// the first calls have warmed their connections.
func TestElectionDistantRedisFreshInstances(t *testing.T) {
	srv := redistest.Need(t)
	px := delayproxy.Start(t, srv.Addr, 75*time.Millisecond)
	const interval = 500 * time.Millisecond
	ss := distantSamplers(t, "redis://"+px.Addr+"/0", 3, interval, 0)
	time.Sleep(6 * interval)
	reads := readsDuring(ss, 10*interval)
	t.Logf("fresh instances, Redis 150 ms away: reads per sampler in 10 intervals %v", reads)
	if !mostlyOneReader(reads, 10) {
		t.Errorf("16 intervals after 3 instances started with Redis 150 ms away (a warm election call takes 150 ms of its 250 ms), the samplers read the database for themselves (reads in 10 intervals %v), want one elected reader",
			reads)
	}
}

// oneIDSink is a serverclock.Sink knowing one query identifier.
type oneIDSink struct{}

func (oneIDSink) QueryIDs(dst []cost.QueryID, _ int) []cost.QueryID {
	return append(dst, cost.QueryID{Fingerprint: 1, ID: 42})
}
func (oneIDSink) ObserveServer(uint64, int64, float64, time.Time) error { return nil }
func (oneIDSink) SetNetworkFloor(time.Duration)                         {}
func (oneIDSink) Reading(time.Time, time.Duration)                      {}
func (oneIDSink) Unidentified() uint64                                  { return 0 }

// countingClockConn is a serverclock.Conn counting its reads.
type countingClockConn struct {
	reads  *atomic.Int64
	calls  int64
	closed atomic.Bool
}

func (c *countingClockConn) Ping(context.Context) error { return nil }
func (c *countingClockConn) Read(context.Context, []int64) (serverclock.Reading, error) {
	c.reads.Add(1)
	c.calls += 10
	return serverclock.Reading{Rows: []serverclock.Row{{QueryID: 42, Calls: c.calls, ExecMS: float64(c.calls)}}}, nil
}
func (c *countingClockConn) IsClosed() bool              { return c.closed.Load() }
func (c *countingClockConn) Close(context.Context) error { c.closed.Store(true); return nil }

// TestServerClockElectionDistantRedisAfterStall: three server-clock readers share an election
// through a Redis 300 ms away, interval 1s (an election call gets a quarter of the round's 2 s,
// about 500 ms) and sync_interval 2s (read timeout 500 ms). After Redis stalls once, they
// return to one reader of pg_stat_statements, as the health samplers do.
func TestServerClockElectionDistantRedisAfterStall(t *testing.T) {
	srv := redistest.Need(t)
	px := delayproxy.Start(t, srv.Addr, 0)
	const interval = time.Second
	counts := make([]*atomic.Int64, 3)
	for i := range counts {
		el, err := NewElection(ElectionOptions{URL: "redis://" + px.Addr + "/0", SyncInterval: 2 * time.Second,
			Instance: fmt.Sprintf("clock-%d", i), Database: electDB, Secret: secretOf(electSecret)})
		if err != nil {
			t.Fatal(err)
		}
		reads := new(atomic.Int64)
		counts[i] = reads
		r := serverclock.NewReader(serverclock.Options{
			Connect:  func(context.Context) (serverclock.Conn, error) { return &countingClockConn{reads: reads}, nil },
			Sink:     oneIDSink{},
			Interval: interval,
			Logger:   quiet,
			Election: el,
		})
		r.Start()
		t.Cleanup(func() { r.Close(); el.Close() })
	}
	window := func(d time.Duration) []int64 {
		before := make([]int64, len(counts))
		for i, c := range counts {
			before[i] = c.Load()
		}
		time.Sleep(d)
		out := make([]int64, len(counts))
		for i, c := range counts {
			out[i] = c.Load() - before[i]
		}
		return out
	}
	time.Sleep(3 * interval) // warm connections
	px.SetDelay(150 * time.Millisecond)
	time.Sleep(3 * interval)
	steady := window(4 * interval)
	t.Logf("steady, 300 ms away: reads per reader in 4 intervals %v", steady)
	if !mostlyOneReader(steady, 4) {
		t.Fatalf("before any stall: reads per reader %v, want one reader", steady)
	}
	px.SetDelay(2 * time.Second)
	time.Sleep(3 * interval)
	px.SetDelay(150 * time.Millisecond)
	time.Sleep(2500 * time.Millisecond)
	time.Sleep(3 * interval)
	after := window(6 * interval)
	t.Logf("after a stall, 300 ms away: reads per reader in 6 intervals %v", after)
	if !mostlyOneReader(after, 6) {
		t.Errorf("after Redis stalled once (300 ms away), the server-clock readers still read pg_stat_statements for themselves (reads in 6 intervals %v), want one elected reader",
			after)
	}
}
