package health

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
)

// ballotBox is an in-memory election shared by the samplers of a test, on the test's clock:
// the Redis one's rules without Redis. Safe for concurrent use.
type ballotBox struct {
	clock *fakeclock.Clock

	mu        sync.Mutex // protects the fields below
	holder    string
	expires   time.Time
	published []Shared
	at        time.Time // when published was published
	fail      error     // every call fails with it while set
	calls     map[string]int
}

// voter is the Election of the instance id.
func (bb *ballotBox) voter(id string) *voter { return &voter{bb: bb, id: id} }

type voter struct {
	bb *ballotBox
	id string
}

func (v *voter) call(name string) error {
	if v.bb.calls == nil {
		v.bb.calls = map[string]int{}
	}
	v.bb.calls[v.id+" "+name]++
	return v.bb.fail
}

func (v *voter) Elect(_ context.Context, b Ballot) (Vote, error) {
	bb := v.bb
	bb.mu.Lock()
	defer bb.mu.Unlock()
	if err := v.call("elect"); err != nil {
		return Vote{}, err
	}
	now := bb.clock.Now()
	if bb.holder == "" || bb.holder == v.id || !now.Before(bb.expires) {
		bb.holder, bb.expires = v.id, now.Add(LeaseIntervals*b.Interval)
		return Vote{Lead: true}, nil
	}
	var out []Shared
	for _, r := range bb.published {
		r.Age += now.Sub(bb.at)
		out = append(out, r)
	}
	return Vote{Published: out}, nil
}

func (v *voter) Publish(_ context.Context, _ Ballot, readings []Shared) error {
	bb := v.bb
	bb.mu.Lock()
	defer bb.mu.Unlock()
	if err := v.call("publish"); err != nil {
		return err
	}
	if bb.holder == v.id {
		bb.published, bb.at = readings, bb.clock.Now()
	}
	return nil
}

func (v *voter) Resign(ctx context.Context, _ Ballot) error {
	bb := v.bb
	bb.mu.Lock()
	defer bb.mu.Unlock()
	if err := v.call("resign"); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err // as Redis's call, never sent
	}
	if bb.holder == v.id {
		bb.holder = ""
	}
	return nil
}

func (bb *ballotBox) count(id, call string) int {
	bb.mu.Lock()
	defer bb.mu.Unlock()
	return bb.calls[id+" "+call]
}

// fixed is an Election whose every vote is v.
type fixed struct{ v Vote }

func (f *fixed) Elect(context.Context, Ballot) (Vote, error)     { return f.v, nil }
func (f *fixed) Publish(context.Context, Ballot, []Shared) error { return nil }
func (f *fixed) Resign(context.Context, Ballot) error            { return nil }

// electedSampler is a sampler of active_queries at interval 1s on clock, voting through el,
// whose connects fail and are counted by dials.
func electedSampler(t *testing.T, clock *fakeclock.Clock, el Election, dials *atomic.Int32) (*Sampler, *logBuffer) {
	t.Helper()
	return sampler(t, clock, el, dials, nil)
}

// sampler is electedSampler that connects to srv (nil: it cannot connect).
func sampler(t *testing.T, clock *fakeclock.Clock, el Election, dials *atomic.Int32, srv *fakeServer) (*Sampler, *logBuffer) {
	t.Helper()
	log, logs := newLogger()
	s := NewSampler(Options{
		Connect: func(ctx context.Context) (Conn, error) {
			dials.Add(1)
			if srv == nil {
				return nil, errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
			}
			return srv.connect(ctx)
		},
		Interval: time.Second,
		Metrics:  []string{vocab.MetricActiveQueries},
		Logger:   log,
		Now:      clock.Now,
		Election: el,
	})
	t.Cleanup(func() { s.Close() })
	return s, logs
}

// TestFollowerAdoptsThePublishedSample: a follower reads nothing from the server; it takes the
// lead's published reading, dated by its age, and counts it as shared, once per sample.
func TestFollowerAdoptsThePublishedSample(t *testing.T) {
	clock := fakeclock.New()
	el := &fixed{Vote{Published: []Shared{{Metric: vocab.MetricActiveQueries, Value: 9, Age: 300 * time.Millisecond}}}}
	var dials atomic.Int32
	s, _ := electedSampler(t, clock, el, &dials)
	if err := s.SampleOnce(context.Background()); err != nil {
		t.Fatalf("SampleOnce as a follower: %v", err)
	}
	v, at, ok := s.Value(vocab.MetricActiveQueries)
	if !ok || v != 9 || !at.Equal(t0.Add(-300*time.Millisecond)) {
		t.Errorf("Value = (%v, %v, %v), want 9 read 300ms before now", v, at, ok)
	}
	if m, _, exceeded, stale := s.Evaluate(clock.Now(), map[string]float64{vocab.MetricActiveQueries: 8}, 0, true); m != vocab.MetricActiveQueries || !exceeded || stale {
		t.Errorf("Evaluate = %s exceeded=%v stale=%v, want active_queries exceeded and fresh", m, exceeded, stale)
	}
	// The same sample read again (the lead has not published since) is not counted twice.
	clock.Advance(250 * time.Millisecond)
	el.v.Published[0].Age += 250 * time.Millisecond
	_ = s.SampleOnce(context.Background())
	if d, sh, n := dials.Load(), s.Shared(), s.Samples(); d != 0 || sh != 1 || n != 0 {
		t.Errorf("dials, shared, samples = %d, %d, %d; want 0, 1, 0", d, sh, n)
	}
	// A newer sample, an interval later, is.
	clock.Advance(time.Second)
	el.v.Published[0] = Shared{Metric: vocab.MetricActiveQueries, Value: 2, Age: 100 * time.Millisecond}
	_ = s.SampleOnce(context.Background())
	if v, _, _ := s.Value(vocab.MetricActiveQueries); v != 2 || s.Shared() != 2 {
		t.Errorf("after a new sample: value %v, shared %d; want 2, 2", v, s.Shared())
	}
}

// TestForgedSampleNeverAdmits: whatever a follower reads that it cannot trust (malformed,
// missing, failed, out of range, dated in the future, too old) is a failed read: the last true
// reading stands until it is StaleIntervals intervals old, and the metric is stale from then on,
// which an enforce budget counts as exceeded. A forged sample can throttle, never admit, unless
// it is a well-formed, fresh, plausible reading (see the package documentation).
func TestForgedSampleNeverAdmits(t *testing.T) {
	aq := vocab.MetricActiveQueries
	for _, tc := range []struct {
		name string
		v    Vote
		want string // in the staleness log
	}{
		{"rejected", Vote{Bad: "not JSON"}, "published sample rejected: not JSON"},
		{"missing", Vote{Published: []Shared{{Metric: "custom.other", Value: 0}}}, "missing from the published sample"},
		{"twice", Vote{Published: []Shared{{Metric: aq, Value: 0}, {Metric: aq, Value: 0}}}, "a metric published twice"},
		{"failed", Vote{Published: []Shared{{Metric: aq, Err: "not connected"}}}, "the elected sampler's read failed: not connected"},
		{"future", Vote{Published: []Shared{{Metric: aq, Value: 0, Age: -time.Hour}}}, "dated in the future"},
		{"old", Vote{Published: []Shared{{Metric: aq, Value: 0, Age: 4 * time.Second}}}, "published sample is 4s old"},
		{"NaN", Vote{Published: []Shared{{Metric: aq, Value: math.NaN()}}}, "out of range"},
		{"negative", Vote{Published: []Shared{{Metric: aq, Value: -5}}}, "out of range"},
		{"fractional", Vote{Published: []Shared{{Metric: aq, Value: 0.5}}}, "out of range"},
		{"huge", Vote{Published: []Shared{{Metric: aq, Value: 1e300}}}, "out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := fakeclock.New()
			var dials atomic.Int32
			s, logs := electedSampler(t, clock, &fixed{Vote{Published: []Shared{{Metric: aq, Value: 20}}}}, &dials)
			_ = s.SampleOnce(context.Background()) // a true, unhealthy reading first
			s.SetElection(&fixed{tc.v})
			_ = s.SampleOnce(context.Background())
			if _, v, exceeded, stale := s.Evaluate(clock.Now(), map[string]float64{aq: 8}, 0, true); !exceeded || stale || v != 20 {
				t.Errorf("after a forged sample: value %v exceeded=%v stale=%v, want the last true reading 20, exceeded", v, exceeded, stale)
			}
			// Once the true reading is too old, the metric is stale, forged samples or not.
			clock.Advance(StaleIntervals*time.Second + time.Millisecond)
			_ = s.SampleOnce(context.Background())
			if _, _, exceeded, stale := s.Evaluate(clock.Now(), map[string]float64{aq: 8}, 0, true); !exceeded || !stale {
				t.Errorf("an enforce budget admits on forged samples alone (exceeded=%v stale=%v)", exceeded, stale)
			}
			if v, _, _ := s.Value(aq); v != 20 {
				t.Errorf("Value = %v after a forged sample, want the last true reading 20", v)
			}
			if !strings.Contains(logs.String(), tc.want) {
				t.Errorf("log lacks %q:\n%s", tc.want, logs)
			}
			if dials.Load() != 0 {
				t.Error("a follower connected to the server")
			}
		})
	}
}

// TestOneLeadAmongSamplers: samplers sharing an election take turns as one lead (the only one
// that connects and publishes) and followers; when the election cannot be held each samples
// for itself, and when the lead closes it resigns, so the next vote elects another.
func TestOneLeadAmongSamplers(t *testing.T) {
	clock := fakeclock.New()
	bb := &ballotBox{clock: clock}
	var dials [3]atomic.Int32
	var ss [3]*Sampler
	srv := &fakeServer{}
	for i := range ss {
		ss[i], _ = sampler(t, clock, bb.voter(string(rune('a'+i))), &dials[i], srv)
	}
	rounds := func() {
		for _, s := range ss {
			if s != nil {
				_, _ = s.round(context.Background(), true)
			}
		}
	}
	rounds()
	rounds()
	if got := [3]int32{dials[0].Load(), dials[1].Load(), dials[2].Load()}; got != [3]int32{1, 0, 0} {
		t.Fatalf("dials per sampler %v, want only the first (the lead) to connect", got)
	}
	if bb.count("a", "publish") != 2 || bb.count("b", "publish") != 0 {
		t.Errorf("publishes: lead %d, follower %d; want 2 and 0", bb.count("a", "publish"), bb.count("b", "publish"))
	}
	// The followers read the lead's sample: healthy (1 active query), not stale.
	if _, _, exceeded, stale := ss[1].Evaluate(clock.Now(), map[string]float64{vocab.MetricActiveQueries: 8}, 0, true); exceeded || stale {
		t.Errorf("follower of a lead that reads the server: exceeded=%v stale=%v, want neither", exceeded, stale)
	}
	if ss[0].Elections() != 1 || ss[1].Elections() != 0 {
		t.Errorf("elections: lead %d, follower %d; want 1 and 0", ss[0].Elections(), ss[1].Elections())
	}

	// Redis unreachable: every sampler samples for itself, once its last sample is old enough
	// that it would go stale (TestFollowerRidesOutAFailedVote).
	bb.mu.Lock()
	bb.fail = errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	bb.mu.Unlock()
	clock.Advance(LeaseIntervals * time.Second)
	rounds()
	for i := range dials {
		if dials[i].Load() == 0 {
			t.Errorf("sampler %d did not sample for itself while the election failed", i)
		}
	}
	bb.mu.Lock()
	bb.fail = nil
	bb.mu.Unlock()

	// The lead closes and resigns: the next round elects another, the only one then to publish.
	if err := ss[0].Close(); err != nil {
		t.Fatal(err)
	}
	if bb.count("a", "resign") != 1 {
		t.Errorf("the closing lead resigned %d times, want once", bb.count("a", "resign"))
	}
	ss[0] = nil
	before := [3]int{0, bb.count("b", "publish"), bb.count("c", "publish")}
	rounds()
	if p1, p2 := bb.count("b", "publish")-before[1], bb.count("c", "publish")-before[2]; p1+p2 != 1 {
		t.Errorf("after the lead closed, %d and %d publishes; want exactly one new lead", p1, p2)
	}
}

// TestLapsedLeaseIsTakenOver: a lead that stops renewing (it died) is replaced once its lease
// lapses, LeaseIntervals intervals after its last vote, at a follower's next poll.
func TestLapsedLeaseIsTakenOver(t *testing.T) {
	clock := fakeclock.New()
	bb := &ballotBox{clock: clock}
	var dA, dB atomic.Int32
	a, _ := sampler(t, clock, bb.voter("a"), &dA, &fakeServer{}) // a lead that reads the server
	b, _ := electedSampler(t, clock, bb.voter("b"), &dB)         // its dials count its own samplings
	_, _ = a.round(context.Background(), true)
	next, _ := b.round(context.Background(), true)
	if dB.Load() != 0 {
		t.Fatal("the follower connected")
	}
	// a dies: b polls on its schedule until it leads.
	var waited time.Duration
	for dB.Load() == 0 && waited < time.Minute {
		clock.Advance(next)
		waited += next
		next, _ = b.round(context.Background(), true)
	}
	if limit := (LeaseIntervals + 1) * time.Second; waited > limit {
		t.Errorf("took over %v after the lead's last vote, want within %v", waited, limit)
	}
	if limit := LeaseIntervals*time.Second + time.Second/4; waited > limit {
		t.Errorf("took over %v after the lead's last vote, want within a quarter interval of the lease's end (%v)", waited, limit)
	}
}

// TestSetMetricsDoesNotWaitForARound: a round's connect (I/O) holds no lock, so a reload that
// empties the metric set (which closes the connection) returns while a round is still
// connecting, and the round closes what it opened when it ends.
func TestSetMetricsDoesNotWaitForARound(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var connecting atomic.Bool
	s := NewSampler(Options{
		Connect: func(ctx context.Context) (Conn, error) {
			connecting.Store(true)
			defer connecting.Store(false)
			close(entered)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil, errors.New("refused")
		},
		Metrics: []string{vocab.MetricActiveQueries},
	})
	defer s.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.SampleOnce(context.Background())
	}()
	<-entered
	s.SetMetrics(nil, nil)
	if !connecting.Load() {
		t.Error("SetMetrics waited for the round's connect to end")
	}
	close(release)
	<-done
}

// TestFollowerRidesOutAFailedVote: one failed election call is no outage; a follower whose
// sample is young keeps it and polls again, and samples for itself only once its readings are
// LeaseIntervals intervals old, before they would go stale.
func TestFollowerRidesOutAFailedVote(t *testing.T) {
	clock := fakeclock.New()
	bb := &ballotBox{clock: clock}
	var dA, dB atomic.Int32
	a, _ := sampler(t, clock, bb.voter("a"), &dA, &fakeServer{}) // a lead that reads the server
	b, _ := electedSampler(t, clock, bb.voter("b"), &dB)         // its dials count its own samplings
	_, _ = a.round(context.Background(), true)                   // the lead
	bb.mu.Lock()
	bb.published = []Shared{{Metric: vocab.MetricActiveQueries, Value: 1}} // as if it read 1
	bb.mu.Unlock()
	if _, err := b.round(context.Background(), true); err != nil || dB.Load() != 0 {
		t.Fatalf("follower round: %v, %d dials", err, dB.Load())
	}
	bb.mu.Lock()
	bb.fail = errors.New("i/o timeout")
	bb.mu.Unlock()
	for clock.Now().Sub(t0) < LeaseIntervals*time.Second {
		next, _ := b.round(context.Background(), true)
		if dB.Load() != 0 {
			t.Fatalf("the follower sampled for itself %v after its last good vote", clock.Now().Sub(t0))
		}
		if next != time.Second/4 {
			t.Errorf("after a failed vote the follower polls in %v, want a quarter interval", next)
		}
		clock.Advance(next)
	}
	_, _ = b.round(context.Background(), true)
	if dB.Load() != 1 {
		t.Errorf("%d dials once the follower's sample was %v old, want it to sample for itself", dB.Load(), clock.Now().Sub(t0))
	}
	// From then on it samples every interval until a vote answers, its own fresh readings
	// notwithstanding (as if its read had succeeded).
	seed(t, b, vocab.MetricActiveQueries, 1, clock.Now())
	next, _ := b.round(context.Background(), true)
	if dB.Load() != 2 || next != time.Second {
		t.Errorf("next round without an election: %d dials in all, next in %v; want 2 and an interval", dB.Load(), next)
	}
}

// TestElectionFailureLoggedOnce: an election that cannot be held is logged when it starts
// failing, not at each new error text: a hung Redis answers by turns with a deadline, an i/o
// timeout and a call still outstanding, which logged a warning per interval for the outage.
func TestElectionFailureLoggedOnce(t *testing.T) {
	clock := fakeclock.New()
	bb := &ballotBox{clock: clock}
	var dials atomic.Int32
	s, logs := sampler(t, clock, bb.voter("a"), &dials, &fakeServer{})
	errs := []error{context.DeadlineExceeded, errors.New("i/o timeout"), errors.New("coord: the previous Redis call has not returned")}
	for i := range 12 {
		bb.mu.Lock()
		bb.fail = errs[i%len(errs)]
		bb.mu.Unlock()
		_, _ = s.round(context.Background(), false)
		clock.Advance(time.Second)
	}
	bb.mu.Lock()
	bb.fail = nil
	bb.mu.Unlock()
	_, _ = s.round(context.Background(), false)
	if n := strings.Count(logs.String(), "cannot be held"); n != 1 {
		t.Errorf("the failing election was logged %d times over 12 rounds, want once:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), "held again") {
		t.Errorf("the election's return was not logged:\n%s", logs)
	}
}
