package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// electionInterval is the tests' health_interval. A follower that takes over from a crashed
// sampler must connect before the last sample goes stale (within half an interval of margin, see
// the health package): an interval long against a connect on a loaded machine under the race
// detector (a few hundred milliseconds), as health_interval is in production (1s).
const electionInterval = 600 * time.Millisecond

// electedInstance is one connector of an election test: an instance with its own Redis client
// (so that a test can cut it off, as a crash would) and its own metrics.
type electedInstance struct {
	c      *driver.Connector
	db     *sql.DB
	rc     *redis.Client
	reader *sdkmetric.ManualReader
	closed bool
}

func (in *electedInstance) close() {
	if !in.closed {
		in.closed = true
		in.db.Close()
		in.rc.Close()
	}
}

// counter is the total of the int64 counter name in in's metrics; 0 before its first point.
func (in *electedInstance) counter(t *testing.T, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := in.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, dp := range sum.DataPoints {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// openElected opens n connectors on dsn with rules, each its own instance with its own client
// of srv (rules' coordination section names no URL).
func openElected(t *testing.T, srv *redistest.Server, dsn, rules string, n int) []*electedInstance {
	t.Helper()
	cfg, err := driver.ParseConfig([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*electedInstance, n)
	for i := range out {
		in := &electedInstance{reader: sdkmetric.NewManualReader(),
			rc: redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(in.reader))
		t.Cleanup(func() { mp.Shutdown(context.Background()) })
		in.c, err = driver.NewConnector(dsn, driver.WithConfig(cfg), driver.WithRedisClient(in.rc), driver.WithMeterProvider(mp))
		if err != nil {
			t.Fatal(err)
		}
		in.db = sql.OpenDB(in.c)
		t.Cleanup(in.close)
		out[i] = in
	}
	return out
}

// probes is how many health queries the server has run: each calls nextval on the sequence.
func probes(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow("select case when is_called then last_value else 0 end from health_probe").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// samplingCounts is each live instance's local health samples (each one health query).
func samplingCounts(t *testing.T, ins []*electedInstance) []int64 {
	out := make([]int64, len(ins))
	for i, in := range ins {
		if !in.closed {
			out[i] = in.counter(t, "pgtraffic.health.samples")
		}
	}
	return out
}

// TestHealthSamplerElection: eight instances with throttle_when and a coordination section put
// one health query per interval on their database (counted by the server: the health query
// calls nextval); the others read the elected one's sample. When the sampling instance closes,
// another takes over and no instance ever reads a stale sample meanwhile (stale is older than
// three intervals); when the next one is cut off from Redis and dies without a word (a crash),
// its lease lapses and another takes over.
func TestHealthSamplerElection(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec("create sequence health_probe"); err != nil {
		t.Fatal(err)
	}
	ins := openElected(t, srv, dsn, fmt.Sprintf(`
coordination: {sync_interval: 200ms}
health_interval: %s
health_queries: {probe: "select 0 * nextval('health_probe')"}
budgets:
  - {name: guarded, mode: enforce, throttle_when: {custom.probe: 1}}
rules:
  - {budget: guarded, match: {app: guarded}}
`, electionInterval), 8)
	ctx := tagging.With(context.Background(), "app", "guarded")
	waitFor(t, healthSettle, "every instance admits on a shared sample", func() (bool, string) {
		var shared []int64
		ok := true
		for _, in := range ins {
			n := in.counter(t, "pgtraffic.health.shared_samples")
			shared = append(shared, n)
			ok = ok && in.c.Check(ctx) == nil
		}
		followers := 0
		for _, n := range shared {
			if n > 0 {
				followers++
			}
		}
		return ok && followers == len(ins)-1, fmt.Sprint("shared samples ", shared)
	})

	// One health query per interval: over 20 intervals, the server counts about 20, all made by
	// one instance. The machine may run rounds late (fewer), never early.
	p0, l0, start := probes(t, admin), samplingCounts(t, ins), time.Now()
	time.Sleep(20 * electionInterval)
	p1, l1, elapsed := probes(t, admin), samplingCounts(t, ins), time.Since(start)
	intervals := float64(elapsed) / float64(electionInterval)
	queries := p1 - p0
	samplers, lead := 0, -1
	var local int64
	for i := range ins {
		if d := l1[i] - l0[i]; d > 0 {
			samplers++
			local += d
			if lead < 0 || d > l1[lead]-l0[lead] {
				lead = i
			}
		}
	}
	t.Logf("8 instances, %.1f intervals: %d health queries on the server (%.2f per interval), by %d instance(s)",
		intervals, queries, float64(queries)/intervals, samplers)
	if queries < 1 || float64(queries) > intervals+2 {
		t.Errorf("%d health queries in %.1f intervals; want one per interval", queries, intervals)
	}
	if samplers != 1 {
		t.Errorf("%d instances sampled the server; want one", samplers)
	}
	if d := local - queries; d < -1 || d > 1 {
		t.Errorf("the instances counted %d local samples, the server %d queries", local, queries)
	}

	// The lead closes: it resigns its lease on the way, another takes over, and no instance
	// sees a stale sample meanwhile.
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	leaseKey := electionKey(t, rc, ":lease")
	takeover, stale := handover(t, ins, lead, ctx, func() {
		holder, err := rc.Get(context.Background(), leaseKey).Result()
		if err != nil {
			t.Fatalf("the lease before the close: %v", err)
		}
		ins[lead].close()
		if now, _ := rc.Get(context.Background(), leaseKey).Result(); now == holder {
			t.Errorf("the closed lead %q still holds the lease", holder)
		}
	})
	t.Logf("closed lead: another took over after %v (%.1f intervals); %d checks refused as stale",
		takeover.Round(time.Millisecond), float64(takeover)/float64(electionInterval), stale)
	if stale != 0 {
		t.Errorf("%d checks refused while the lead handed over; want none", stale)
	}

	// The new lead crashes: cut off from Redis, then gone without resigning. Its lease lapses
	// (two intervals) and a follower polling a quarter interval later takes over.
	lead = -1
	before := samplingCounts(t, ins)
	time.Sleep(2 * electionInterval)
	for i, n := range samplingCounts(t, ins) {
		if n > before[i] {
			lead = i
		}
	}
	if lead < 0 {
		t.Fatal("no instance samples after the handover")
	}
	takeover, stale = handover(t, ins, lead, ctx, func() {
		ins[lead].rc.Close()
		ins[lead].close()
	})
	t.Logf("crashed lead: another took over after %v (%.1f intervals); %d checks refused as stale",
		takeover.Round(time.Millisecond), float64(takeover)/float64(electionInterval), stale)
	if stale != 0 {
		t.Errorf("%d checks refused while a lapsed lease was taken over; want none", stale)
	}
}

// electionKey is the one election key of Redis ending in suffix (":lease" or ":sample").
func electionKey(t *testing.T, rc *redis.Client, suffix string) string {
	t.Helper()
	var key string
	waitFor(t, healthSettle, "the election's "+suffix+" key", func() (bool, string) {
		keys, err := rc.Keys(context.Background(), "pgtraffic:{health:*}"+suffix).Result()
		if len(keys) == 1 {
			key = keys[0]
		}
		return len(keys) == 1, fmt.Sprint(keys, err)
	})
	return key
}

// TestHealthSamplerWithoutRedis: while Redis is down every instance samples for itself; once
// it is back (empty, after a restart) they elect one sampler again.
func TestHealthSamplerWithoutRedis(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec("create sequence health_probe"); err != nil {
		t.Fatal(err)
	}
	ins := openElected(t, srv, dsn, fmt.Sprintf(`
coordination: {sync_interval: 200ms}
health_interval: %s
health_queries: {probe: "select 0 * nextval('health_probe')"}
budgets:
  - {name: guarded, mode: enforce, throttle_when: {custom.probe: 1}}
rules:
  - {budget: guarded, match: {app: guarded}}
`, electionInterval), 3)
	// samplersOver counts the instances that sampled over n intervals, and the server's queries.
	samplersOver := func(n int) (samplers int, queries int64) {
		p0, l0 := probes(t, admin), samplingCounts(t, ins)
		time.Sleep(time.Duration(n) * electionInterval)
		p1, l1 := probes(t, admin), samplingCounts(t, ins)
		for i := range l1 {
			if l1[i] > l0[i] {
				samplers++
			}
		}
		return samplers, p1 - p0
	}
	waitFor(t, healthSettle, "one sampler", func() (bool, string) {
		n, q := samplersOver(5)
		return n == 1, fmt.Sprintf("%d samplers, %d queries", n, q)
	})
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * electionInterval) // the followers' samples age past two intervals
	n, q := samplersOver(10)
	t.Logf("Redis down: %d instances sampled, %d health queries in 10 intervals", n, q)
	if n != len(ins) {
		t.Errorf("while Redis was down %d of %d instances sampled for themselves", n, len(ins))
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, healthSettle, "one sampler again after Redis's return", func() (bool, string) {
		n, q := samplersOver(5)
		return n == 1, fmt.Sprintf("%d samplers, %d queries", n, q)
	})
}

// handover runs kill on the lead ins[lead] and returns how long until another instance
// sampled, and how many checks on the others were refused as stale from the kill until three
// intervals after the takeover.
func handover(t *testing.T, ins []*electedInstance, lead int, ctx context.Context, kill func()) (took time.Duration, stale int) {
	t.Helper()
	before := samplingCounts(t, ins)
	start := time.Now()
	kill()
	var end time.Time
	for end.IsZero() || time.Now().Before(end) {
		if time.Since(start) > healthSettle {
			t.Fatalf("no instance took over within %v", healthSettle)
		}
		for i, in := range ins {
			if in.closed {
				continue
			}
			if err := in.c.Check(ctx); err != nil {
				var be *driver.BlockedError
				if !errors.As(err, &be) || be.Reason != driver.ReasonHealth {
					t.Fatalf("Check: %v", err)
				}
				stale++
				t.Logf("instance %d refused %v after the kill: %v", i, time.Since(start).Round(time.Millisecond), err)
			}
		}
		if end.IsZero() {
			for i, n := range samplingCounts(t, ins) {
				if i != lead && n > before[i] {
					took = time.Since(start)
					end = time.Now().Add(3 * electionInterval)
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return took, stale
}

// TestForgedHealthSampleDoesNotAdmit: a writer of Redis holds the election's lease (so every
// instance follows) and publishes "healthy" samples: well-formed and fresh but not signed with
// the database's key, dated in the future, unreadable, NaN or far too large. The database is
// unhealthy (the health query reads 10, the threshold is 5): no instance ever admits a
// statement of the enforce budget, nor adopts a forged reading; each reads its metric as stale,
// or, for the unsigned sample, samples the database for itself.
func TestForgedHealthSampleDoesNotAdmit(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	rules := fmt.Sprintf(`
coordination: {sync_interval: 200ms}
health_interval: %s
health_queries: {load: "select 10"}
budgets:
  - {name: guarded, mode: enforce, throttle_when: {custom.load: 5}}
rules:
  - {budget: guarded, match: {app: guarded}}
`, electionInterval)
	ins := openElected(t, srv, dsn, rules, 3)
	ctx := tagging.With(context.Background(), "app", "guarded")
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	var lease, sample string
	waitFor(t, healthSettle, "the election's keys appear", func() (bool, string) {
		keys, err := rc.Keys(context.Background(), "pgtraffic:{health:*}:*").Result()
		for _, k := range keys {
			switch {
			case strings.HasSuffix(k, ":lease"):
				lease = k
			case strings.HasSuffix(k, ":sample"):
				sample = k
			}
		}
		return lease != "" && sample != "", fmt.Sprint(keys, err)
	})
	// The honest sample: every instance refuses, for the value read, not for staleness.
	waitFor(t, healthSettle, "every instance refuses on the honest sample", func() (bool, string) {
		for i, in := range ins {
			if ok, state := healthBlocked(in.c.Check(ctx), "guarded", "custom.load=10"); !ok {
				return false, fmt.Sprintf("instance %d: %s", i, state)
			}
		}
		return true, ""
	})
	healthy := func(r string) string { return `'{"f":1,"r":[` + r + `]}'` }
	for _, tc := range []struct{ name, at, data string }{
		{"well-formed and fresh, unsigned", "now", healthy(`{"m":"custom.load","v":"0","a":0}`)},
		{"dated in the future", "now + 60000000", healthy(`{"m":"custom.load","v":"0","a":0}`)},
		{"NaN", "now", healthy(`{"m":"custom.load","v":"NaN","a":0}`)},
		{"unreadable", "now", "'healthy'"},
		{"too large", "now", "string.rep(' ', 100000) .. " + healthy(`{"m":"custom.load","v":"0","a":0}`)},
		{"negative age", "now", healthy(`{"m":"custom.load","v":"0","a":-1000000}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			script := "local t = redis.call('TIME'); local now = t[1] * 1000000 + t[2]\n" +
				"redis.call('SET', KEYS[1], 'mallory', 'PX', 300)\n" +
				"redis.call('DEL', KEYS[2]); redis.call('HSET', KEYS[2], 'at', " + tc.at + ", 'data', " + tc.data + ")"
			fctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				for fctx.Err() == nil {
					if err := rc.Eval(fctx, script, []string{lease, sample}).Err(); err != nil && fctx.Err() == nil && !errors.Is(err, redis.Nil) {
						t.Errorf("forging: %v", err)
						return
					}
					time.Sleep(5 * time.Millisecond)
				}
			}()
			defer func() { cancel(); <-done }()
			shared := make([]int64, len(ins))
			for i, in := range ins {
				shared[i] = in.counter(t, "pgtraffic.health.shared_samples")
			}
			checks := 0
			for end := time.Now().Add(10 * electionInterval); time.Now().Before(end); checks++ {
				for i, in := range ins {
					err := in.c.Check(ctx)
					var be *driver.BlockedError
					if !errors.As(err, &be) || be.Reason != driver.ReasonHealth {
						t.Fatalf("instance %d under a forged sample: Check = %v, want a health refusal", i, err)
					}
				}
				time.Sleep(10 * time.Millisecond)
			}
			for i, in := range ins {
				if n := in.counter(t, "pgtraffic.health.shared_samples"); n != shared[i] {
					t.Errorf("instance %d adopted %d forged readings", i, n-shared[i])
				}
			}
			t.Logf("%d checks on each of %d instances, every one refused", checks, len(ins))
		})
	}
}

// TestHealthElectionWithoutSystemID: where the role may not read the cluster's system
// identifier (EXECUTE on pg_control_system revoked), no instance can sign or check a sample:
// each samples the database for itself, adopts nothing through Redis, and still throttles on
// what it reads.
func TestHealthElectionWithoutSystemID(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	role := fmt.Sprintf("no_sysid_%d", time.Now().UnixNano())
	for _, q := range []string{
		"create role " + role + " login",
		"revoke execute on function pg_control_system() from public",
		"create sequence health_probe",
		"grant usage, update on sequence health_probe to " + role,
	} {
		if _, err := admin.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { admin.Exec("drop owned by " + role); admin.Exec("drop role " + role) })
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	ins := openElected(t, srv, u.String(), fmt.Sprintf(`
coordination: {sync_interval: 200ms}
health_interval: %s
health_queries: {probe: "select 10 + 0 * nextval('health_probe')"}
budgets:
  - {name: guarded, mode: enforce, throttle_when: {custom.probe: 5}}
rules:
  - {budget: guarded, match: {app: guarded}}
`, electionInterval), 3)
	ctx := tagging.With(context.Background(), "app", "guarded")
	waitFor(t, healthSettle, "every instance refuses on what it reads", func() (bool, string) {
		for i, in := range ins {
			if ok, state := healthBlocked(in.c.Check(ctx), "guarded", "custom.probe=10"); !ok {
				return false, fmt.Sprintf("instance %d: %s", i, state)
			}
		}
		return true, ""
	})
	l0 := samplingCounts(t, ins)
	time.Sleep(5 * electionInterval)
	l1 := samplingCounts(t, ins)
	for i, in := range ins {
		if l1[i] <= l0[i] {
			t.Errorf("instance %d did not sample for itself (%d → %d samples)", i, l0[i], l1[i])
		}
		if n := in.counter(t, "pgtraffic.health.shared_samples"); n != 0 {
			t.Errorf("instance %d adopted %d readings through Redis without a key to check them by", i, n)
		}
	}
}
