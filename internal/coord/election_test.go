package coord

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/internal/health"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

const electDB = "app@db.example.com:5432/orders"

func newElection(t *testing.T, srv *redistest.Server, instance, database string) *Election {
	t.Helper()
	e, err := NewElection(ElectionOptions{Client: newClient(t, srv), Instance: instance, Database: database})
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
	if err := b.Publish(ctx, ballot, []health.Shared{{Metric: "active_queries", Value: 0}}); err != nil {
		t.Fatal(err)
	}
	// The sample sits 10ms in Redis: its publication moves 10ms back in Redis's time.
	_, sampleKey := ElectionKeys(electDB, ballot.Set)
	if err := newClient(t, srv).HIncrBy(ctx, sampleKey, "at", -(10 * time.Millisecond).Microseconds()).Err(); err != nil {
		t.Fatal(err)
	}
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
// never gets a reading it should not trust: a lease that is not one of ours is taken over,
// and a sample that is malformed, too large, dated in the future or absurdly old comes back
// as Bad (stale), never as readings.
func TestElectionForgedState(t *testing.T) {
	srv := redistest.Need(t)
	rc := newClient(t, srv)
	ballot := health.Ballot{Set: "forged", Interval: time.Second}
	lease, sample := ElectionKeys(electDB, ballot.Set)
	const nowUS = "local t = redis.call('TIME'); local now = t[1] * 1000000 + t[2]\n"
	const holder = "redis.call('SET', KEYS[1], 'mallory', 'PX', 2000)\n"
	for _, tc := range []struct {
		name, script string
		lead         bool
		bad          string
	}{
		{"lease without expiry", "redis.call('SET', KEYS[1], 'mallory')", true, ""},
		{"lease longer than any", "redis.call('SET', KEYS[1], 'mallory', 'PX', 99999999)", true, ""},
		{"lease of another type", "redis.call('HSET', KEYS[1], 'x', 'y')", true, ""},
		{"sample of another type", holder + "redis.call('SET', KEYS[2], 'x')", false, ""},
		{"not JSON", holder + nowUS + "redis.call('HSET', KEYS[2], 'at', now, 'data', '{')", false, "not a sample"},
		{"unknown format", holder + nowUS + `redis.call('HSET', KEYS[2], 'at', now, 'data', '{"f":2,"r":[]}')`, false, "format 2"},
		{"too large", holder + nowUS + "redis.call('HSET', KEYS[2], 'at', now, 'data', string.rep('x', 70000))", false, "too large"},
		{"future", holder + nowUS + `redis.call('HSET', KEYS[2], 'at', now + 60000000, 'data', '{"f":1,"r":[{"m":"active_queries","v":"0","a":0}]}')`, false, "dated in the future"},
		{"negative age", holder + nowUS + `redis.call('HSET', KEYS[2], 'at', now, 'data', '{"f":1,"r":[{"m":"active_queries","v":"0","a":-9000000}]}')`, false, "dated in the future or absurdly old"},
		{"ancient", holder + `redis.call('HSET', KEYS[2], 'at', 1, 'data', '{"f":1,"r":[{"m":"active_queries","v":"0","a":0}]}')`, false, "absurdly old"},
		{"negative date", holder + `redis.call('HSET', KEYS[2], 'at', -5, 'data', '{"f":1,"r":[]}')`, false, "unreadable date"},
		{"unreadable value", holder + nowUS + `redis.call('HSET', KEYS[2], 'at', now, 'data', '{"f":1,"r":[{"m":"active_queries","v":"zero","a":0}]}')`, false, "unreadable value"},
		{"no data", holder + nowUS + "redis.call('HSET', KEYS[2], 'at', now)", false, "incomplete"},
		{"too many readings", holder + nowUS + `local r = {} for i = 1, 300 do r[i] = '{"m":"x","v":"1","a":0}' end redis.call('HSET', KEYS[2], 'at', now, 'data', '{"f":1,"r":[' .. table.concat(r, ',') .. ']}')`, false, "too many readings"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if err := rc.Del(ctx, lease, sample).Err(); err != nil {
				t.Fatal(err)
			}
			if err := rc.Eval(ctx, tc.script, []string{lease, sample}).Err(); err != nil && err.Error() != "redis: nil" {
				t.Fatalf("forging: %v", err)
			}
			v := elect(t, newElection(t, srv, "honest", electDB), ballot)
			if v.Lead != tc.lead || !strings.Contains(v.Bad, tc.bad) || tc.bad != "" && v.Bad == "" || v.Bad != "" && v.Published != nil {
				t.Errorf("vote = %+v; want lead=%v, bad containing %q, no readings with bad", v, tc.lead, tc.bad)
			}
			if tc.bad == "" && !tc.lead && v.Published != nil {
				t.Errorf("readings from a forged sample: %+v", v.Published)
			}
		})
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
	e, err := NewElection(ElectionOptions{Client: hc, Instance: "a", Database: electDB})
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
