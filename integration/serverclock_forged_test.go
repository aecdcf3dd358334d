package integration

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	goruntime "runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/coord"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// serverClockSet is the server clock's metric set in the election (serverclock's electionSet,
// unexported), and serverClockPrefix begins each of its readings' names (sharedPrefix).
const (
	serverClockSet    = "pgtraffic server clock"
	serverClockPrefix = "queryid:"
)

// forgedMean is the mean, in seconds, the forger claims for the lookups: 1 ns.
const forgedMean = 1e-9

// TestForgedServerClockSampleNotAdopted: three instances coordinate through Redis and share one
// server clock reader; every one learns the lookups' server mean. Then a writer of Redis who
// cannot read the database holds the server clock election's lease (so that every instance
// follows) and keeps publishing a well-formed, fresh sample, not signed with the database's
// key, claiming the lookups cost 1 ns. Over 15 intervals: no instance's server mean for the
// pattern falls below a hundredth of the real one read before (the forged one is some 10⁻⁴
// of it; a lookup's honest means vary by a few times at most), no instance adopts a shared
// reading, and every instance reads pg_stat_statements for itself (which shows that the
// forged lease and sample did reach them).
func TestForgedServerClockSampleNotAdopted(t *testing.T) {
	const interval = 200 * time.Millisecond
	rs := redistest.Need(t)
	srv := pgtest.Shared(t)
	dsn, admin := lookupDatabase(t, srv)
	ins := openElected(t, rs, dsn, fmt.Sprintf(`
coordination: {sync_interval: 200ms}
health_interval: %s
budgets:
  - {name: lookups, mode: warn, server_share: 0.5, burst_limit: 1000s}
rules:
  - {budget: lookups, match: {table: t}}
`, interval), 3)

	// Each instance runs lookups all along, so that the pattern stays reported.
	wctx, stopWork := context.WithCancel(context.Background())
	var work sync.WaitGroup
	defer func() { stopWork(); work.Wait() }()
	for i, in := range ins {
		work.Go(func() {
			for wctx.Err() == nil {
				var v int
				if err := in.db.QueryRowContext(wctx, ssLookup, rand.IntN(1000)+1).Scan(&v); err != nil {
					if wctx.Err() == nil {
						t.Errorf("instance %d: a lookup failed: %v", i, err)
					}
					return
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	means := func() ([]float64, []driver.Snapshot) {
		out, snaps := make([]float64, len(ins)), make([]driver.Snapshot, len(ins))
		for i, in := range ins {
			snaps[i] = in.c.Snapshot()
			if ps, ok := lookupStatus(snaps[i]); ok && ps.Clock == driver.ClockServer {
				out[i] = ps.ServerMean
			}
		}
		return out, snaps
	}
	waitFor(t, 30*time.Second, "one reader, every instance on its server mean for the lookups", func() (bool, string) {
		m, snaps := means()
		readers, shared := 0, 0
		var state []string
		for i, s := range snaps {
			if s.Counters.ServerClockReads > 0 {
				readers++
			}
			if s.Counters.ServerClockShared > 0 {
				shared++
			}
			state = append(state, fmt.Sprintf("mean %.3g s, reads %d, shared %d", m[i], s.Counters.ServerClockReads, s.Counters.ServerClockShared))
		}
		ok := readers == 1 && shared == len(ins)-1
		for _, v := range m {
			ok = ok && v > 0
		}
		return ok, fmt.Sprint(state)
	})

	// The keys of the server clock's election, and the lookups' query identifier, which the
	// honest sample must name.
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	lease, sample := coord.ElectionKeys(healthIdentity(cc), serverClockSet)
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rc.Close()
	var queryID int64
	if err := admin.QueryRow(context.Background(), `select queryid from pg_stat_statements
		where dbid = (select oid from pg_database where datname = current_database()) and toplevel and query = $1`,
		ssLookup).Scan(&queryID); err != nil {
		t.Fatalf("the lookups' query identifier: %v", err)
	}
	metric := serverClockPrefix + strconv.FormatInt(queryID, 10)
	waitFor(t, healthSettle, "the honest sample names the lookups' query identifier", func() (bool, string) {
		h, err := rc.HGetAll(context.Background(), sample).Result()
		if err != nil || h["sig"] == "" {
			return false, fmt.Sprint(sample, " ", h, err)
		}
		var w struct {
			R []struct {
				M string `json:"m"`
			} `json:"r"`
		}
		if err := json.Unmarshal([]byte(h["data"]), &w); err != nil {
			return false, fmt.Sprint(h, err)
		}
		for _, r := range w.R {
			if r.M == metric {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%s not in %s", metric, h["data"])
	})

	var real []float64
	waitFor(t, healthSettle, "every instance's server mean for the lookups", func() (bool, string) {
		real, _ = means()
		for _, v := range real {
			if v <= 0 {
				return false, fmt.Sprint(real)
			}
		}
		return true, ""
	})
	t.Logf("server means learned for the lookups (query id %d): %v s", queryID, real)

	// The forger: the lease (shorter than an instance's, so the election script honours it)
	// and a fresh, well-formed, unsigned sample claiming 1 ns, dated by Redis's clock.
	data := fmt.Sprintf(`{"f":1,"r":[{"m":%q,"v":%q,"a":0}]}`, metric, strconv.FormatFloat(forgedMean, 'g', -1, 64))
	forge := redis.NewScript(`local t = redis.call('TIME'); local now = t[1] * 1000000 + t[2]
redis.call('SET', KEYS[1], 'mallory', 'PX', 300)
redis.call('DEL', KEYS[2]); redis.call('HSET', KEYS[2], 'at', now, 'data', ARGV[1])`)
	fctx, stopForging := context.WithCancel(context.Background())
	forging := make(chan struct{})
	go func() {
		defer close(forging)
		for fctx.Err() == nil {
			if err := forge.Run(fctx, rc, []string{lease, sample}, data).Err(); err != nil && fctx.Err() == nil && !errors.Is(err, redis.Nil) {
				t.Errorf("forging: %v", err)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	defer func() { stopForging(); <-forging }()

	// A round under way when the forging began may still adopt the honest sample: count from
	// an interval later.
	time.Sleep(interval)
	_, before := means()
	lowest := make([]float64, len(ins))
	copy(lowest, real)
	polls := 0
	for end := time.Now().Add(15 * interval); time.Now().Before(end); polls++ {
		m, _ := means()
		for i, v := range m {
			if v == 0 {
				continue // not on the server's clock for a moment: no server mean to judge
			}
			lowest[i] = min(lowest[i], v)
			if v/real[i] < 0.01 {
				t.Fatalf("instance %d adopted the forged sample: its server mean for the lookups is %.3g s, %.2g × the real %.3g s (forged %.3g s)",
					i, v, v/real[i], real[i], forgedMean)
			}
		}
		time.Sleep(interval / 8)
	}
	if holder, err := rc.Get(context.Background(), lease).Result(); err != nil || holder != "mallory" {
		t.Fatalf("the forger lost the lease: holder %q, %v", holder, err)
	}
	last, after := means()
	for i := range ins {
		b, a := before[i].Counters, after[i].Counters
		t.Logf("instance %d under forgery: server mean %.3g s at the end, %.3g s at the lowest (%.2f × the real %.3g s); reads %d → %d, shared %d → %d, rejected %d → %d",
			i, last[i], lowest[i], lowest[i]/real[i], real[i], b.ServerClockReads, a.ServerClockReads,
			b.ServerClockShared, a.ServerClockShared, b.ServerClockRejected, a.ServerClockRejected)
		if a.ServerClockShared != b.ServerClockShared {
			t.Errorf("instance %d adopted %d shared readings under forgery", i, a.ServerClockShared-b.ServerClockShared)
		}
		if a.ServerClockReads <= b.ServerClockReads {
			t.Errorf("instance %d did not read pg_stat_statements for itself under forgery (%d → %d reads)",
				i, b.ServerClockReads, a.ServerClockReads)
		}
	}
	t.Logf("%d polls of %d instances over 15 intervals: no forged mean adopted", polls, len(ins))
}

// healthIdentity is how the driver names a database's session in its election keys (driver's
// healthDatabase): user@host:port[,host:port…]/dbname[?check][;param=value…].
func healthIdentity(cc *pgx.ConnConfig) string {
	id := cc.User + "@" + serverIdentity(cc)
	for _, k := range slices.Sorted(maps.Keys(cc.RuntimeParams)) {
		if k != "application_name" {
			id += ";" + k + "=" + cc.RuntimeParams[k]
		}
	}
	return id
}

// serverIdentity is how the driver names a server and database in its shared budgets' keys
// (driver's serverOf): host:port[,host:port…]/dbname, and the name of the check of
// target_session_attrs when it has one.
func serverIdentity(cc *pgx.ConnConfig) string {
	hosts := fmt.Sprintf("%s:%d", cc.Host, cc.Port)
	seen := map[string]bool{hosts: true}
	for _, f := range cc.Fallbacks {
		if h := fmt.Sprintf("%s:%d", f.Host, f.Port); !seen[h] {
			seen[h] = true
			hosts += "," + h
		}
	}
	id := hosts + "/" + cmp.Or(cc.Database, cc.User)
	if cc.ValidateConnect != nil {
		id += "?" + goruntime.FuncForPC(reflect.ValueOf(cc.ValidateConnect).Pointer()).Name()
	}
	return id
}
