package coord

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/internal/health"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

const electDB = "app@db.example.com:5432/orders"

// electSecret is the database's secret in these tests (the driver reads the cluster's system
// identifier).
const electSecret = "7300000000000000001"

func secretOf(s string) func(context.Context) (string, error) {
	return func(context.Context) (string, error) { return s, nil }
}

func newElection(t *testing.T, srv *redistest.Server, instance, database string) *Election {
	t.Helper()
	e, err := NewElection(ElectionOptions{Client: newClient(t, srv), Instance: instance, Database: database,
		Secret: secretOf(electSecret)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func elect(t *testing.T, e *Election, b health.Ballot) health.Vote {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := e.Elect(ctx, b)
	if err != nil {
		t.Fatalf("Elect: %v", err)
	}
	return v
}

// TestElectionOneLead: of two instances of one database, the first to vote leads and the
// other follows; the lead's sample reaches the follower with its values (infinities and
// failed reads included) and ages that grow by the time it sat in Redis; a resignation hands
// the lease over at the next vote; another database elects its own lead.
func TestElectionOneLead(t *testing.T) {
	srv := redistest.Need(t)
	a, b := newElection(t, srv, "a", electDB), newElection(t, srv, "b", electDB)
	ballot := health.Ballot{Set: "set1", Interval: time.Second}
	if v := elect(t, a, ballot); !v.Lead {
		t.Fatalf("first vote: %+v, want the lead", v)
	}
	if v := elect(t, b, ballot); v.Lead || v.Published != nil || v.Bad != "" {
		t.Fatalf("second instance before any sample: %+v, want a follower with nothing published", v)
	}
	sent := []health.Shared{
		{Metric: "active_queries", Value: 7, Age: 20 * time.Millisecond},
		{Metric: "custom.inf", Value: math.Inf(1)},
		{Metric: "replication_lag", Err: "not connected"},
	}
	ctx := context.Background()
	if err := a.Publish(ctx, ballot, sent); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, ballot, []health.Shared{{Metric: "active_queries", Value: 0}}); err == nil {
		t.Fatal("an instance never elected published a sample")
	}
	time.Sleep(10 * time.Millisecond) // the sample sits 10ms in Redis
	v := elect(t, b, ballot)
	if v.Lead || v.Bad != "" || len(v.Published) != len(sent) {
		t.Fatalf("follower's vote: %+v, want the lead's sample (a follower's publication is ignored)", v)
	}
	for i, got := range v.Published {
		want := sent[i]
		if got.Metric != want.Metric || got.Err != want.Err || got.Value != want.Value && !(math.IsNaN(got.Value) && math.IsNaN(want.Value)) {
			t.Errorf("reading %d = %+v, want %+v", i, got, want)
		}
		if got.Age < want.Age+10*time.Millisecond || got.Age > want.Age+time.Second {
			t.Errorf("reading %d is %v old, want its age at publication %v plus the 10ms it sat in Redis", i, got.Age, want.Age)
		}
	}
	if v := elect(t, a, ballot); !v.Lead {
		t.Errorf("the lead's renewal: %+v", v)
	}
	if err := a.Resign(ctx, ballot); err != nil {
		t.Fatal(err)
	}
	if v := elect(t, b, ballot); !v.Lead {
		t.Errorf("after the lead resigned: %+v, want the lead", v)
	}
	if v := elect(t, a, ballot); v.Lead {
		t.Errorf("the resigned instance leads again while the new lead holds the lease")
	}
	other := newElection(t, srv, "a", "app@db.example.com:5433/orders")
	if v := elect(t, other, ballot); !v.Lead {
		t.Errorf("another database (another port) shares a lead: %+v", v)
	}
	if v := elect(t, a, health.Ballot{Set: "set2", Interval: time.Second}); !v.Lead {
		t.Errorf("another metric set shares a lead: %+v", v)
	}
}

// TestElectionLeaseLapses: a lease lasts LeaseIntervals intervals unless renewed, and the
// sample StaleIntervals.
func TestElectionLeaseLapses(t *testing.T) {
	srv := redistest.Need(t)
	a := newElection(t, srv, "a", electDB)
	ballot := health.Ballot{Set: "s", Interval: 100 * time.Millisecond}
	elect(t, a, ballot)
	if err := a.Publish(context.Background(), ballot, []health.Shared{{Metric: "active_queries", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	rc := newClient(t, srv)
	lease, sample := ElectionKeys(electDB, ballot.Set)
	for key, want := range map[string]time.Duration{lease: 200 * time.Millisecond, sample: 300 * time.Millisecond} {
		ttl, err := rc.PTTL(context.Background(), key).Result()
		if err != nil || ttl <= 0 || ttl > want {
			t.Errorf("PTTL %s = %v, %v; want within (0, %v]", key, ttl, err, want)
		}
	}
}

// TestElectionKeysHideTheDatabase: keys are digests; the host, user and database name never
// appear in Redis.
func TestElectionKeysHideTheDatabase(t *testing.T) {
	lease, sample := ElectionKeys(electDB, "set")
	for _, k := range []string{lease, sample} {
		for _, secret := range []string{"app", "example", "5432", "orders"} {
			if strings.Contains(strings.TrimPrefix(k, KeyPrefix), secret) {
				t.Errorf("key %q contains %q", k, secret)
			}
		}
		if !strings.HasPrefix(k, KeyPrefix+"{health:") {
			t.Errorf("key %q is not under %s{health:...}", k, KeyPrefix)
		}
	}
	if l2, _ := ElectionKeys(electDB, "other"); l2 == lease {
		t.Error("two metric sets share a lease key")
	}
}

// TestElectionForgedState: whatever else is written into the election's keys, a follower
// never gets a reading it should not trust. A lease that is not one of ours is taken over. A
// sample that is not signed with the database's key (unsigned, signed with another database's,
// or a signed one whose date or data was rewritten) is never read: Elect fails with
// ErrUnsigned, and the sampler samples for itself. A signed sample replayed later reads as old
// as it is. And a signed sample that is malformed, too large, dated in the future or absurdly
// old (a lead with a bug) comes back as Bad (stale), never as readings.
func TestElectionForgedState(t *testing.T) {
	srv := redistest.Need(t)
	rc := newClient(t, srv)
	ctx := context.Background()
	ballot := health.Ballot{Set: "forged", Interval: time.Second}
	lease, sample := ElectionKeys(electDB, ballot.Set)
	const holder = "redis.call('SET', KEYS[1], 'mallory', 'PX', 2000)\n"
	healthy := `{"f":1,"r":[{"m":"active_queries","v":"0","a":0}]}`
	// publish writes a sample dated at µs after Redis's now, signed with secret unless it is
	// "", as a lead that knows secret would, then has edit rewrite it as Redis's writer would.
	publish := func(t *testing.T, at int64, data, secret string, edit map[string]any) {
		t.Helper()
		now, err := rc.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		date := strconv.FormatInt(now.UnixMicro()+at, 10)
		fields := map[string]any{"at": date, "data": data}
		if secret != "" {
			fields["sig"] = sign(keyOf(secret), sample, date, data)
		}
		for k, v := range edit {
			fields[k] = v
		}
		if err := rc.HSet(ctx, sample, fields).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		script string // run first, on the lease and sample keys
		at     int64  // with data: a sample dated at µs from now
		data   string
		secret string
		edit   map[string]any
		lead   bool
		bad    string
		err    error
		honest bool // the sample is the lead's: its readings are read
	}{
		{name: "lease without expiry", script: "redis.call('SET', KEYS[1], 'mallory')", lead: true},
		{name: "lease longer than any", script: "redis.call('SET', KEYS[1], 'mallory', 'PX', 99999999)", lead: true},
		{name: "lease of another type", script: "redis.call('HSET', KEYS[1], 'x', 'y')", lead: true},
		{name: "sample of another type", script: holder + "redis.call('SET', KEYS[2], 'x')"},
		{name: "too large", script: holder + "redis.call('HSET', KEYS[2], 'at', 1, 'data', string.rep('x', 70000))", bad: "too large"},
		{name: "signature too large", script: holder + "redis.call('HSET', KEYS[2], 'at', 1, 'data', '{}', 'sig', string.rep('0', 65))", bad: "too large"},
		{name: "no data", script: holder + "redis.call('HSET', KEYS[2], 'at', 1)", bad: "incomplete"},

		{name: "unsigned healthy", script: holder, data: healthy, err: ErrUnsigned},
		{name: "signed with another database's key", script: holder, data: healthy, secret: "another cluster", err: ErrUnsigned},
		{name: "signature of other data", script: holder, data: healthy, secret: electSecret,
			edit: map[string]any{"data": `{"f":1,"r":[{"m":"active_queries","v":"1","a":0}]}`}, err: ErrUnsigned},
		{name: "date rewritten", script: holder, at: -30e6, data: healthy, secret: electSecret,
			edit: map[string]any{"at": "1"}, err: ErrUnsigned},
		{name: "signature of another set", script: holder, data: healthy, secret: electSecret,
			edit: map[string]any{"sig": sign(keyOf(electSecret), "pgtraffic:{health:0}:sample", "1", healthy)}, err: ErrUnsigned},

		{name: "not JSON", script: holder, data: "{", secret: electSecret, bad: "not a sample"},
		{name: "unknown format", script: holder, data: `{"f":2,"r":[]}`, secret: electSecret, bad: "format 2"},
		{name: "future", script: holder, at: 60e6, data: healthy, secret: electSecret, bad: "dated in the future"},
		{name: "negative age", script: holder, data: `{"f":1,"r":[{"m":"active_queries","v":"0","a":-9000000}]}`, secret: electSecret, bad: "dated in the future or absurdly old"},
		{name: "ancient", script: holder, at: -5 * 24 * time.Hour.Microseconds(), data: healthy, secret: electSecret, bad: "absurdly old"},
		// Under health_interval: 10h a reader polls about an eighth of an interval late.
		{name: "honest, of a long interval", script: holder, at: -75 * time.Minute.Microseconds(), data: healthy, secret: electSecret, honest: true},
		{name: "unreadable value", script: holder, data: `{"f":1,"r":[{"m":"active_queries","v":"zero","a":0}]}`, secret: electSecret, bad: "unreadable value"},
		{name: "too many readings", script: holder, data: `{"f":1,"r":[` + strings.Repeat(`{"m":"x","v":"1","a":0},`, 300) + `{"m":"y","v":"1","a":0}]}`, secret: electSecret, bad: "too many readings"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := rc.Del(ctx, lease, sample).Err(); err != nil {
				t.Fatal(err)
			}
			if err := rc.Eval(ctx, tc.script, []string{lease, sample}).Err(); err != nil && err.Error() != "redis: nil" {
				t.Fatalf("forging: %v", err)
			}
			if tc.data != "" {
				publish(t, tc.at, tc.data, tc.secret, tc.edit)
			}
			ectx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			v, err := newElection(t, srv, "honest", electDB).Elect(ectx, ballot)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || v.Published != nil {
					t.Errorf("vote = %+v, %v; want no readings and %v", v, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Elect: %v", err)
			}
			if v.Lead != tc.lead || !strings.Contains(v.Bad, tc.bad) || tc.bad != "" && v.Bad == "" || v.Bad != "" && v.Published != nil {
				t.Errorf("vote = %+v; want lead=%v, bad containing %q, no readings with bad", v, tc.lead, tc.bad)
			}
			if tc.bad == "" && !tc.lead && v.Published != nil && !tc.honest {
				t.Errorf("readings from a forged sample: %+v", v.Published)
			}
			if tc.honest && (len(v.Published) != 1 || v.Published[0].Age < 75*time.Minute) {
				t.Errorf("the lead's sample read as %+v, want its reading, 75 minutes old", v)
			}
		})
	}
}

// TestElectionReplayedSampleIsOld: a sample the lead signed, written again later by whoever
// can write Redis (with a fresh expiry), reads as old as it is: its readings are stale to the
// sampler, never fresh.
func TestElectionReplayedSampleIsOld(t *testing.T) {
	srv := redistest.Need(t)
	ctx := context.Background()
	a, b := newElection(t, srv, "a", electDB), newElection(t, srv, "b", electDB)
	ballot := health.Ballot{Set: "replayed", Interval: 100 * time.Millisecond}
	if v := elect(t, a, ballot); !v.Lead {
		t.Fatalf("first vote: %+v, want the lead", v)
	}
	if err := a.Publish(ctx, ballot, []health.Shared{{Metric: "active_queries", Value: 0}}); err != nil {
		t.Fatal(err)
	}
	rc := newClient(t, srv)
	_, sample := ElectionKeys(electDB, ballot.Set)
	kept, err := rc.HGetAll(ctx, sample).Result()
	if err != nil || kept["sig"] == "" {
		t.Fatalf("the lead's sample: %v, %v; want a signed one", kept, err)
	}
	time.Sleep(time.Duration(health.StaleIntervals+1) * ballot.Interval)
	if err := rc.HSet(ctx, sample, kept).Err(); err != nil { // replayed, the lease held on
		t.Fatal(err)
	}
	if v := elect(t, a, ballot); !v.Lead {
		t.Fatalf("renewal: %+v", v)
	}
	v := elect(t, b, ballot)
	if v.Bad != "" || len(v.Published) != 1 {
		t.Fatalf("follower's vote: %+v, want the replayed sample", v)
	}
	if age, stale := v.Published[0].Age, health.StaleIntervals*ballot.Interval; age <= stale {
		t.Errorf("the replayed reading is %v old, want older than %v (stale)", age, stale)
	}
}

// TestElectionWaitsForItsKey: until the database's secret is read, no election is held (the
// sampler samples for itself, without a warning): a vote waits for the first reading as long as
// its context lets it, and once a reading failed it is refused at once while the next is tried
// in the background.
func TestElectionWaitsForItsKey(t *testing.T) {
	srv := redistest.Need(t)
	var calls atomic.Int32
	gate := make(chan struct{})
	e, err := NewElection(ElectionOptions{Client: newClient(t, srv), Instance: "a", Database: electDB,
		Secret: func(ctx context.Context) (string, error) {
			if calls.Add(1) == 1 {
				return "", errors.New("connection refused")
			}
			select {
			case <-gate:
				return electSecret, nil
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	ballot := health.Ballot{Set: "keyed", Interval: time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := e.Elect(ctx, ballot); !errors.Is(err, health.ErrNotReady) {
		t.Fatalf("Elect before the secret is read: %v, want %v", err, health.ErrNotReady)
	}
	// The first reading failed: until the next succeeds, a vote is refused at once.
	start := time.Now()
	if _, err := e.Elect(context.Background(), ballot); !errors.Is(err, health.ErrNotReady) {
		t.Fatalf("Elect after a failed reading: %v, want %v", err, health.ErrNotReady)
	}
	if waited := time.Since(start); waited > 500*time.Millisecond {
		t.Errorf("Elect after a failed reading waited %v, want an answer at once", waited)
	}
	close(gate)
	deadline := time.Now().Add(5 * time.Second) // the retry comes within a second
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		v, err := e.Elect(ctx, ballot)
		cancel()
		if err == nil {
			if !v.Lead {
				t.Errorf("vote once the secret is read: %+v", v)
			}
			break
		}
		if !errors.Is(err, health.ErrNotReady) || time.Now().After(deadline) {
			t.Fatalf("Elect once the secret can be read: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("secret read %d times, want 2 (one failure, one retry)", n)
	}
	if _, err := NewElection(ElectionOptions{Client: newClient(t, srv), Instance: "b", Database: electDB}); err == nil {
		t.Error("an election without a secret was made")
	}
}

// TestElectionUnreachable: an election that cannot reach Redis says so (the sampler then
// samples for itself), within its context.
func TestElectionUnreachable(t *testing.T) {
	srv := redistest.Need(t)
	e := newElection(t, srv, "a", electDB)
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := e.Elect(ctx, health.Ballot{Set: "s", Interval: time.Second}); err == nil {
		t.Fatal("Elect against a dead Redis succeeded")
	}
}

// heldClient holds the election calls of the ballot set whose lease key is held until
// release is closed, saying on entered when one is held; after, it holds none.
type heldClient struct {
	*redis.Client
	held             string
	entered, release chan struct{}
}

func (h *heldClient) hold(keys []string) {
	if len(keys) == 0 || keys[0] != h.held {
		return
	}
	select {
	case <-h.release:
	case h.entered <- struct{}{}:
		<-h.release
	}
}

func (h *heldClient) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	h.hold(keys)
	return h.Client.EvalSha(ctx, sha, keys, args...)
}

func (h *heldClient) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	h.hold(keys)
	return h.Client.Eval(ctx, script, keys, args...)
}

// TestElectionSetsDoNotWaitForEachOther: the health sampler and the server clock's reader
// vote through one Election; while a call of one set is outstanding (a slow Redis), a vote of
// the other is held all the same (it used to fail at once, and its instance then read the
// server for itself and logged that the election could not be held), and a second call of
// the same set still fails at once.
func TestElectionSetsDoNotWaitForEachOther(t *testing.T) {
	srv := redistest.Need(t)
	slow, other := health.Ballot{Set: "health set", Interval: time.Second}, health.Ballot{Set: "pgtraffic server clock", Interval: time.Second}
	held, _ := ElectionKeys(electDB, slow.Set)
	hc := &heldClient{Client: newClient(t, srv), held: held, entered: make(chan struct{}), release: make(chan struct{})}
	e, err := NewElection(ElectionOptions{Client: hc, Instance: "a", Database: electDB, Secret: secretOf(electSecret)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := e.Elect(context.Background(), slow)
		done <- err
	}()
	<-hc.entered
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if v, err := e.Elect(ctx, other); err != nil || !v.Lead {
		t.Errorf("vote of another set while one call is outstanding: %+v, %v; want the lead", v, err)
	}
	if _, err := e.Elect(ctx, slow); !errors.Is(err, errBusy) {
		t.Errorf("second call of the outstanding set: %v, want %v", err, errBusy)
	}
	close(hc.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if v, err := e.Elect(ctx, slow); err != nil || !v.Lead {
		t.Errorf("vote once the call returned: %+v, %v; want the lead", v, err)
	}
}

// TestElectionLongReadErrorIsPublished: a lead whose read failed with an error of any length
// (the server's message can quote a whole query) publishes it cut, and the followers take the
// sample as the lead's, not as a forgery: the bounds a follower holds a sample to are ones an
// honest lead keeps (the rules bound the metrics' number and names).
func TestElectionLongReadErrorIsPublished(t *testing.T) {
	srv := redistest.Need(t)
	a, b := newElection(t, srv, "a", electDB), newElection(t, srv, "b", electDB)
	ballot := health.Ballot{Set: "long-error", Interval: time.Second}
	if v := elect(t, a, ballot); !v.Lead {
		t.Fatalf("first vote: %+v, want the lead", v)
	}
	long := "ERROR: " + strings.Repeat("x", 5000)
	if err := a.Publish(context.Background(), ballot, []health.Shared{{Metric: "custom.q", Err: long}}); err != nil {
		t.Fatal(err)
	}
	v := elect(t, b, ballot)
	if v.Bad != "" || len(v.Published) != 1 {
		t.Fatalf("follower's vote: %+v, want the lead's sample", v)
	}
	if got := v.Published[0].Err; len(got) > maxSampleText || !strings.HasPrefix(got, "ERROR: xxx") {
		t.Errorf("published error of %d bytes (%.20q…), want the lead's, cut to %d", len(got), got, maxSampleText)
	}
}
