package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/serverclock"
	clockconn "github.com/pgtraffic/pgtraffic/internal/serverclock/pgxconn"
)

// clockSink is a serverclock.Sink that records what the reader teaches of one pattern.
type clockSink struct {
	mu       sync.Mutex
	ids      []cost.QueryID
	observed []float64
	failed   int
}

func (s *clockSink) QueryIDs(dst []cost.QueryID, max int) []cost.QueryID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append(dst, s.ids[:min(max, len(s.ids))]...)
}

func (s *clockSink) ObserveServer(_ uint64, _ int64, seconds float64, _ time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observed = append(s.observed, seconds)
	return nil
}

func (s *clockSink) SetNetworkFloor(time.Duration) {}

func (s *clockSink) Unidentified() uint64 { return 0 }

func (s *clockSink) Reading(until time.Time, _ time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if until.IsZero() {
		s.failed++
	}
}

func (s *clockSink) take() []float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.observed
	s.observed = nil
	return o
}

// clockDB is a database with pg_stat_statements and a one-row table rv, the admin
// connection to it, its oid, and a reader connector to it.
func clockDB(t *testing.T) (dsn string, admin *pgx.Conn, dbid uint32) {
	t.Helper()
	srv := pgtest.Shared(t)
	ctx := context.Background()
	dsn = srv.CreateDatabase(t)
	srv.EnableStatStatements(t, dsn)
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(ctx) })
	if _, err := admin.Exec(ctx, `create table rv (id int); insert into rv values (1); grant select on rv to public`); err != nil {
		t.Fatal(err)
	}
	if err := admin.QueryRow(ctx, `select oid from pg_database where datname = current_database()`).Scan(&dbid); err != nil {
		t.Fatal(err)
	}
	return dsn, admin, dbid
}

const sleepSQL = `select pg_sleep($1::float8) from rv`

func runSleeps(t *testing.T, c *pgx.Conn, n int, sleep float64) {
	t.Helper()
	for range n {
		if _, err := c.Exec(context.Background(), sleepSQL, sleep); err != nil {
			t.Fatal(err)
		}
	}
}

func sleepQueryID(t *testing.T, admin *pgx.Conn, dbid uint32) int64 {
	t.Helper()
	var id int64
	if err := admin.QueryRow(context.Background(), `select queryid from pg_stat_statements
		where dbid = $1 and toplevel and query = $2 limit 1`, dbid, sleepSQL).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

func newClockReader(t *testing.T, dsn string, sink *clockSink) *serverclock.Reader {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	r := serverclock.NewReader(serverclock.Options{Connect: clockconn.Connector(cfg, nil), Sink: sink,
		Interval: time.Hour, // rounds run by the test only
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(func() { r.Close() })
	return r
}

// userCounters returns role userid's counters of query id in database dbid.
func userCounters(t *testing.T, admin *pgx.Conn, dbid uint32, id int64, user string) (calls int64, ms float64) {
	t.Helper()
	if err := admin.QueryRow(context.Background(), `select coalesce(sum(calls), 0)::int8, coalesce(sum(total_exec_time), 0)
		from pg_stat_statements where dbid = $1 and toplevel and queryid = $2 and userid = $3::regrole`, dbid, id, user).Scan(&calls, &ms); err != nil {
		t.Fatal(err)
	}
	return calls, ms
}

// TestServerClockOneRoleEntryGone: the same statement is run by two roles; one role's
// entry (a job that runs it rarely and slowly) is removed, as pg_stat_statements evicts its
// least used entries (here pg_stat_statements_reset of that role, which does the same to the
// entry and moves neither stats_reset nor dealloc), while the application's role runs it more.
// Summed over roles the counters would still grow, and the read would take the application's
// growth less the job's whole history for the interval's executions, a fraction of the
// server's mean; read per role, the job's entry counts as reset and the application's
// executions teach their own mean.
func TestServerClockOneRoleEntryGone(t *testing.T) {
	ctx := context.Background()
	dsn, admin, dbid := clockDB(t)
	var suffix [4]byte
	rand.Read(suffix[:])
	role := "rv_job_" + hex.EncodeToString(suffix[:])
	if _, err := admin.Exec(ctx, `create role `+role+` login`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, dsn)
		if err == nil {
			c.Exec(ctx, `drop owned by `+role)
			c.Exec(ctx, `drop role `+role)
			c.Close(ctx)
		}
	})
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User = role
	job, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer job.Close(ctx)
	runSleeps(t, job, 2, 0.15)    // the job: 2 calls, ~300ms
	runSleeps(t, admin, 5, 0.001) // the application
	id := sleepQueryID(t, admin, dbid)
	sink := &clockSink{ids: []cost.QueryID{{Fingerprint: 1, ID: id}}}
	r := newClockReader(t, dsn, sink)
	r.Round(ctx) // the baseline
	if c := r.Counts(); c.Reads != 1 {
		t.Fatalf("the baseline read failed: %+v", c)
	}
	c0, ms0 := userCounters(t, admin, dbid, id, "postgres")
	if _, err := admin.Exec(ctx, `select pg_stat_statements_reset($1::regrole, $2, $3)`, role, dbid, id); err != nil {
		t.Fatal(err)
	}
	runSleeps(t, admin, 400, 0.001)
	c1, ms1 := userCounters(t, admin, dbid, id, "postgres")
	truth := (ms1 - ms0) / 1e3 / float64(c1-c0)
	r.Round(ctx)
	got := sink.take()
	t.Logf("the application's role: %d calls, %.1f ms in the interval (%.3f ms a call); learned %v s; counts %+v", c1-c0, ms1-ms0, truth*1e3, got, r.Counts())
	if len(got) == 0 || r.Counts().Resets == 0 {
		t.Fatalf("learned %v, counts %+v: want the application's mean, and the job's entry counted as reset", got, r.Counts())
	}
	for _, s := range got {
		if ratio := s / truth; ratio < 0.75 || ratio > 1.33 {
			t.Errorf("learned %.3f ms a call, the server's mean over the interval is %.3f ms (%.2f×): one role's entry gone, masked by the others' growth", s*1e3, truth*1e3, ratio)
		}
	}
}

// TestServerClockWholeResetRegrown: a whole pg_stat_statements_reset() moves stats_reset,
// so a re-created entry that outgrew the baseline within the interval teaches nothing (and is
// counted): a guarantee.
func TestServerClockWholeResetRegrown(t *testing.T) {
	ctx := context.Background()
	dsn, admin, dbid := clockDB(t)
	runSleeps(t, admin, 20, 0)
	id := sleepQueryID(t, admin, dbid)
	sink := &clockSink{ids: []cost.QueryID{{Fingerprint: 1, ID: id}}}
	r := newClockReader(t, dsn, sink)
	r.Round(ctx)
	// A whole reset, as a database-wide reset of this database would not move the stamp: use the
	// global one (other tests' counters in the shared cluster are reset too, as
	// TestServerClockBadInput does).
	if _, err := admin.Exec(ctx, `select pg_stat_statements_reset()`); err != nil {
		t.Fatal(err)
	}
	runSleeps(t, admin, 30, 0.002)
	r.Round(ctx)
	if got := sink.take(); len(got) != 0 {
		t.Fatalf("learned %v after a whole reset: want nothing for that read", got)
	}
	if c := r.Counts(); c.Resets == 0 {
		t.Fatalf("counts %+v: the reset was not counted", c)
	}
}

// TestServerClockAfterEviction: as TestServerClockOneRoleEntryGone, but the job's entry is
// evicted by pg_stat_statements itself (pg_stat_statements.max = 100, then more distinct
// statements than that, each run often enough to outrank the job's entry), between two reads,
// while the application's role runs the statement. pg_stat_statements_info.dealloc moves: any
// entry may have been evicted and made anew, so the read teaches nothing and counts a reset
// (or, were it to teach, the server's mean).
func TestServerClockAfterEviction(t *testing.T) {
	pgtest.Shared(t) // fails, or skips outside CI, where there is no PostgreSQL
	ctx := context.Background()
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	dsn := srv.CreateDatabase(t)
	srv.EnableStatStatements(t, dsn)
	func() {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, `alter system set pg_stat_statements.max = 100`); err != nil {
			t.Fatal(err)
		}
	}()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `create table rv (id int); insert into rv values (1); grant select on rv to public;
		create role rv_job login;
		do $$ begin for i in 0..199 loop execute format('create table rv_%s (id int)', i); end loop; end $$`); err != nil {
		t.Fatal(err)
	}
	var dbid uint32
	if err := admin.QueryRow(ctx, `select oid from pg_database where datname = current_database()`).Scan(&dbid); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User = "rv_job"
	job, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer job.Close(ctx)
	runSleeps(t, job, 2, 0.3)     // the job: 2 calls, ~600ms
	runSleeps(t, admin, 5, 0.001) // the application
	id := sleepQueryID(t, admin, dbid)
	sink := &clockSink{ids: []cost.QueryID{{Fingerprint: 1, ID: id}}}
	r := newClockReader(t, dsn, sink)
	r.Round(ctx) // the baseline
	if c := r.Counts(); c.Reads != 1 {
		t.Fatalf("the baseline read failed: %+v", c)
	}
	var dealloc0 int64
	admin.QueryRow(ctx, `select dealloc from pg_stat_statements_info`).Scan(&dealloc0)
	c0, ms0 := userCounters(t, admin, dbid, id, "postgres")
	gone := false
	for i := 0; i < 200 && !gone; i++ {
		for range 10 {
			if _, err := admin.Exec(ctx, fmt.Sprintf(`select id from rv_%d where id = $1`, i), 1); err != nil {
				t.Fatal(err)
			}
		}
		runSleeps(t, admin, 1, 0.002) // the application keeps running
		if jc, _ := userCounters(t, admin, dbid, id, "rv_job"); jc == 0 {
			gone = true
		}
	}
	if !gone {
		t.Fatal("the job's entry was never evicted: 200 statements run ten times each did not outrank it")
	}
	runSleeps(t, admin, 400, 0.002)
	c1, ms1 := userCounters(t, admin, dbid, id, "postgres")
	var dealloc1 int64
	admin.QueryRow(ctx, `select dealloc from pg_stat_statements_info`).Scan(&dealloc1)
	truth := (ms1 - ms0) / 1e3 / float64(c1-c0)
	r.Round(ctx)
	got := sink.take()
	t.Logf("evictions (dealloc) %d -> %d; the application's role: %d calls, %.1f ms in the interval (%.3f ms a call); learned %v s; counts %+v",
		dealloc0, dealloc1, c1-c0, ms1-ms0, truth*1e3, got, r.Counts())
	if c1 < c0 {
		t.Fatal("the application's own entry was evicted too: it runs more than any other statement")
	}
	if dealloc1 == dealloc0 || r.Counts().Resets == 0 {
		t.Fatalf("evictions %d -> %d, counts %+v: want the eviction seen and counted as a reset", dealloc0, dealloc1, r.Counts())
	}
	for _, s := range got {
		if ratio := s / truth; ratio < 0.75 || ratio > 1.33 {
			t.Errorf("learned %.3f ms a call, the server's mean over the interval is %.3f ms (%.2f×) after an eviction", s*1e3, truth*1e3, ratio)
		}
	}
}
