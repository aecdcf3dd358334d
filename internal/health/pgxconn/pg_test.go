package pgxconn_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/health"
	"github.com/pgtraffic/pgtraffic/internal/health/pgxconn"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// Integration tests of the sampler on a pgx connection against a real PostgreSQL. They do not
// run in parallel: active_queries is server-wide, so concurrent tests would disturb it.

func TestMain(m *testing.M) { pgtest.Main(m) }

// pgSampler returns a sampler connecting to dsn, closed (and checked) when
// the test ends, its log, and what it connected.
func pgSampler(t *testing.T, dsn string, o health.Options) (*health.Sampler, *logBuffer, *dialer) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	log, logs := newLogger()
	d := &dialer{connect: pgxconn.Connector(cfg, nil)}
	o.Logger, o.Connect = log, d.dial
	s := health.NewSampler(o)
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, logs, d
}

// dialer counts the connections a sampler opens and keeps the last; safe for concurrent use.
type dialer struct {
	connect func(context.Context) (health.Conn, error)
	mu      sync.Mutex // protects the fields below
	dials   int
	last    health.Conn
}

func (d *dialer) dial(ctx context.Context) (health.Conn, error) {
	c, err := d.connect(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dials++
	if err == nil {
		d.last = c
	}
	return c, err
}

// opened returns how many connections were opened and whether the last one is still open.
func (d *dialer) opened() (dials int, lastOpen bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dials, d.last != nil && !d.last.IsClosed()
}

func pgConnect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// eventually polls cond every 20ms until it holds or timeout passes; cond
// returns whether it holds and what it saw, for the failure message.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, saw := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; last saw %s", what, timeout, saw)
		}
		<-tick.C
	}
}

// sampled runs a round and returns metric's value, failing on a read error. On a loaded
// machine one read can outlast the sampler's statement timeout, so a failed round is tried
// again, twice at most: a read that cannot succeed still fails the test.
func sampled(t *testing.T, s *health.Sampler, metric string) float64 {
	t.Helper()
	before := s.Samples()
	for try := 1; ; try++ {
		err := s.SampleOnce(context.Background())
		if err == nil {
			break
		}
		if try == 3 {
			t.Fatalf("SampleOnce, %d rounds in a row: %v", try, err)
		}
		t.Logf("SampleOnce: %v; trying again", err)
	}
	v, _, ok := s.Value(metric)
	if !ok {
		t.Fatalf("no value for %s after a good round", metric)
	}
	if s.Samples() <= before {
		t.Fatalf("a good round counted no sample (%d -> %d)", before, s.Samples())
	}
	return v
}

// healthBackends returns the pids of sampler backends in the database of conn.
func healthBackends(t *testing.T, conn *pgx.Conn) []int32 {
	t.Helper()
	rows, err := conn.Query(context.Background(),
		`select pid from pg_stat_activity where application_name = $1 and datname = current_database() order by pid`,
		health.ApplicationName)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

func TestPGActiveQueries(t *testing.T) {
	dsn := pgtest.Shared(t).DSN
	s, _, _ := pgSampler(t, dsn, health.Options{Metrics: []string{vocab.MetricActiveQueries}})
	if base := sampled(t, s, vocab.MetricActiveQueries); base >= 8 {
		t.Fatalf("active_queries = %v before the load, want < 8", base)
	}

	const sleepers = 8
	conns := make([]*pgx.Conn, sleepers)
	for i := range conns {
		conns[i] = pgConnect(t, dsn)
	}
	var wg sync.WaitGroup
	errs := make(chan error, sleepers)
	for _, c := range conns {
		wg.Go(func() {
			if _, err := c.Exec(context.Background(), "select pg_sleep(3)"); err != nil {
				errs <- err
			}
		})
	}
	th := map[string]float64{vocab.MetricActiveQueries: sleepers}
	eventually(t, 3*time.Second, "active_queries >= 8 while 8 sessions sleep", func() (bool, string) {
		v := sampled(t, s, vocab.MetricActiveQueries)
		return v >= sleepers, fmt.Sprint(v)
	})
	if m, v, exceeded, stale := s.Evaluate(time.Now(), th, 0, true); m != vocab.MetricActiveQueries || !exceeded || stale || v < sleepers {
		t.Errorf("Evaluate under load = (%q, %v, %v, %v), want active_queries exceeded", m, v, exceeded, stale)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("sleeper: %v", err)
	}
	eventually(t, 5*time.Second, "active_queries falls back after the sleepers end", func() (bool, string) {
		v := sampled(t, s, vocab.MetricActiveQueries)
		return v < 2, fmt.Sprint(v)
	})
	if _, _, exceeded, stale := s.Evaluate(time.Now(), th, 0, true); exceeded || stale {
		t.Errorf("Evaluate after the load: exceeded=%v stale=%v, want neither", exceeded, stale)
	}
}

func TestPGReplicationLag(t *testing.T) {
	primary := pgtest.Shared(t)
	if primary.DataDir == "" {
		// An external server cannot be given a standby; use a throwaway one.
		var err error
		if primary, err = pgtest.Start(); err != nil {
			t.Fatalf("a throwaway primary for the standby test: %v", err)
		}
		t.Cleanup(func() { primary.Stop() })
	}
	standby, err := primary.StartStandby()
	if err != nil {
		t.Fatalf("StartStandby: %v", err)
	}
	t.Cleanup(func() {
		if err := standby.Stop(); err != nil {
			t.Errorf("standby Stop: %v", err)
		}
	})
	ctx := context.Background()
	pconn := pgConnect(t, primary.DSN)
	if _, err := pconn.Exec(ctx, "create table lag_probe (id bigserial primary key, at timestamptz default now())"); err != nil {
		t.Fatal(err)
	}
	// The shared server outlives the test (go test -count=3 runs it again on it).
	t.Cleanup(func() {
		if _, err := pconn.Exec(context.Background(), "drop table lag_probe"); err != nil {
			t.Errorf("drop lag_probe: %v", err)
		}
	})

	// Before pausing, the standby must have replayed a transaction (the
	// table) and caught up: the lag is measured from the last one replayed.
	sconn := pgConnect(t, standby.DSN)
	eventually(t, 10*time.Second, "the standby replays the table", func() (bool, string) {
		var ok bool
		err := sconn.QueryRow(ctx, "select to_regclass('lag_probe') is not null").Scan(&ok)
		return err == nil && ok, fmt.Sprint(ok, err)
	})
	ss, _, _ := pgSampler(t, standby.DSN, health.Options{Metrics: []string{vocab.MetricReplicationLag}})
	eventually(t, 10*time.Second, "the standby catches up (lag 0)", func() (bool, string) {
		v := sampled(t, ss, vocab.MetricReplicationLag)
		return v == 0, fmt.Sprint(v)
	})

	if _, err := sconn.Exec(ctx, "select pg_wal_replay_pause()"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sconn.Exec(context.Background(), "select pg_wal_replay_resume()") })

	// Write on the primary, one transaction per row, until the lag shows.
	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	wconn := pgConnect(t, primary.DSN)
	var stopOnce sync.Once
	stopWriter := func() error {
		stopOnce.Do(func() { close(stop) })
		return <-writerDone
	}
	// Registered after wconn's cleanup, so it runs first: the writer is done
	// with the connection before it is closed, even when the test fails.
	t.Cleanup(func() { stopWriter() })
	go func() {
		defer close(writerDone)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := wconn.Exec(ctx, "insert into lag_probe default values"); err != nil {
				writerDone <- err
				return
			}
			select {
			case <-stop:
				writerDone <- nil
				return
			case <-tick.C:
			}
		}
	}()
	var lag float64
	eventually(t, 8*time.Second, "replication lag grows above 1s while replay is paused", func() (bool, string) {
		lag = sampled(t, ss, vocab.MetricReplicationLag)
		return lag > 1, fmt.Sprint(lag)
	})
	if err := stopWriter(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	if m, v, exceeded, stale := ss.Evaluate(time.Now(), map[string]float64{vocab.MetricReplicationLag: 1}, 0, true); m != vocab.MetricReplicationLag || !exceeded || stale || v <= 1 {
		t.Errorf("Evaluate while lagging = (%q, %v, %v, %v), want replication_lag exceeded", m, v, exceeded, stale)
	}

	if _, err := sconn.Exec(ctx, "select pg_wal_replay_resume()"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "replication lag returns to 0 after replay resumes", func() (bool, string) {
		v := sampled(t, ss, vocab.MetricReplicationLag)
		return v < 0.1, fmt.Sprint(v)
	})

	// A role that cannot see the WAL receiver's status cannot tell a caught-up standby from one
	// cut off from its primary: its read fails (stale), never 0. pg_monitor lets it see.
	role := fmt.Sprintf("lag_reader_%d", time.Now().UnixNano())
	if _, err := pconn.Exec(ctx, "create role "+role+" login"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pconn.Exec(context.Background(), "drop role "+role) })
	eventually(t, 10*time.Second, "the standby replays the role", func() (bool, string) {
		var ok bool
		err := sconn.QueryRow(ctx, "select exists (select 1 from pg_roles where rolname = $1)", role).Scan(&ok)
		return err == nil && ok, fmt.Sprint(ok, err)
	})
	u, err := url.Parse(standby.DSN)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	rs, _, _ := pgSampler(t, u.String(), health.Options{Metrics: []string{vocab.MetricReplicationLag}})
	if err := rs.SampleOnce(ctx); err == nil || !strings.Contains(err.Error(), "pg_stat_wal_receiver") {
		t.Errorf("replication_lag read by a role without pg_monitor: %v; want a failed read naming pg_stat_wal_receiver", err)
	}
	if _, err := pconn.Exec(ctx, "grant pg_monitor to "+role); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the role with pg_monitor reads the caught-up standby's lag as 0", func() (bool, string) {
		err := rs.SampleOnce(ctx)
		v, _, ok := rs.Value(vocab.MetricReplicationLag)
		return err == nil && ok && v == 0, fmt.Sprint(v, ok, err)
	})

	// The primary form: the largest replay_lag of its standbys.
	ps, _, _ := pgSampler(t, primary.DSN, health.Options{Metrics: []string{vocab.MetricReplicationLag}})
	if v := sampled(t, ps, vocab.MetricReplicationLag); v < 0 || v > 60 {
		t.Errorf("replication_lag on the primary = %v, want a number in [0, 60]", v)
	}
	// A role that cannot see the primary's standbys (their state is hidden from it) reads the
	// lag as unknown too, never as a 0 that says all is well.
	blind := role + "_blind"
	if _, err := pconn.Exec(ctx, "create role "+blind+" login"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pconn.Exec(context.Background(), "drop role "+blind) })
	pu, err := url.Parse(primary.DSN)
	if err != nil {
		t.Fatal(err)
	}
	pu.User = url.User(blind)
	bs, _, _ := pgSampler(t, pu.String(), health.Options{Metrics: []string{vocab.MetricReplicationLag}})
	if err := bs.SampleOnce(ctx); err == nil || !strings.Contains(err.Error(), "pg_stat_replication") {
		t.Errorf("replication_lag read on the primary by a role without pg_monitor: %v; want a failed read naming pg_stat_replication", err)
	}
	t.Logf("peak standby lag seen %.2fs", lag)
}

func TestPGCustomQueries(t *testing.T) {
	s, logs, d := pgSampler(t, pgtest.Shared(t).DSN, health.Options{Interval: time.Second})
	tests := []struct {
		name, sql string
		want      float64
		wantErr   string // "" for a good read
	}{
		{"int4", "select 42", 42, ""},
		{"int2", "select 3::int2", 3, ""},
		{"int8", "select count(*) from generate_series(1, 5)", 5, ""},
		{"float8", "select 1.5::float8", 1.5, ""},
		{"numeric", "select 2.25::numeric", 2.25, ""},
		{"text", "select 'x'::text", 0, "returned a column of type text, want int2, int4, int8, float4, float8 or numeric"},
		{"numeric-looking text", "select '7'", 0, "returned a column of type text"},
		{"two columns", "select 1, 2", 0, "returned 2 columns, want one number"},
		{"no rows", "select 1 where false", 0, "returned no rows"},
		{"two rows", "select generate_series(1, 2)", 0, "returned more than one row"},
		{"NULL", "select null::int", 0, "returned NULL"},
		{"NaN", "select 'NaN'::float8", 0, "returned NaN"},
		{"missing table", "select count(*) from no_such_table", 0, "server error SQLSTATE 42P01 (undefined_table)"},
		{"two statements", "select 1; select 2", 0, "server error SQLSTATE 42601 (syntax_error)"},
		{"not a query", "set work_mem = '8MB'", 0, "returned no rows"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A metric of its own: one that keeps its name keeps its last reading across a
			// change of its query.
			name := fmt.Sprintf("q%d", i)
			m := vocab.MetricCustomPrefix + name
			s.SetMetrics([]string{m}, map[string]string{name: tt.sql})
			errsBefore := s.Errors()
			err := s.SampleOnce(context.Background())
			v, _, ok := s.Value(m)
			metric, _, exceeded, stale := s.Evaluate(time.Now(), map[string]float64{m: 1e9}, 0, true)
			if tt.wantErr == "" {
				if err != nil || !ok || v != tt.want || exceeded || stale {
					t.Fatalf("SampleOnce = %v, Value = (%v, %v), exceeded=%v stale=%v; want %v, fresh", err, v, ok, exceeded, stale, tt.want)
				}
				return
			}
			want := "health: " + m + ": " + tt.wantErr
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("SampleOnce = %v, want an error containing %q", err, want)
			}
			if ok || metric != m || !exceeded || !stale {
				t.Errorf("after a bad read: Value ok=%v, Evaluate = (%q, exceeded=%v, stale=%v); want no value, stale, exceeded", ok, metric, exceeded, stale)
			}
			if got := s.Errors() - errsBefore; got != 1 {
				t.Errorf("Errors() grew by %d, want 1", got)
			}
			if !strings.Contains(logs.String(), "metric="+m+" error=\""+tt.wantErr) {
				t.Errorf("the failure was not logged clearly:\n%s", logs)
			}
		})
	}

	t.Run("an error is logged once until it changes", func(t *testing.T) {
		s.SetMetrics([]string{"custom.text"}, map[string]string{"text": "select 'x'"})
		before := logs.count("metric=custom.text")
		for range 3 {
			if err := s.SampleOnce(context.Background()); err == nil {
				t.Fatal("text query read without error")
			}
		}
		if n := logs.count("metric=custom.text") - before; n != 1 {
			t.Errorf("logged %d times over 3 rounds, want 1:\n%s", n, logs)
		}
	})
	t.Run("a bad result or a server error keeps the connection", func(t *testing.T) {
		if dials, open := d.opened(); dials != 1 || !open {
			t.Errorf("%d connections opened, the last open: %v; want the first, still open", dials, open)
		}
	})
}

func TestPGReadTimeout(t *testing.T) {
	s, _, d := pgSampler(t, pgtest.Shared(t).DSN, health.Options{
		Interval: time.Second,
		Timeout:  300 * time.Millisecond,
		Metrics:  []string{"custom.slow"},
		Queries:  map[string]string{"slow": "select 1 from pg_sleep(3)"},
	})
	start := time.Now()
	err := s.SampleOnce(context.Background())
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("a read bounded by 300ms took %v", took)
	}
	if err == nil || !strings.Contains(err.Error(), "health: custom.slow: timed out after 300ms") {
		t.Fatalf("SampleOnce = %v, want a timeout", err)
	}
	// Normally the server cancels the statement itself (statement_timeout at
	// two thirds of the timeout) and the connection survives; on a starved
	// machine the client deadline can win, and the next round reconnects.
	serverCanceled := strings.Contains(err.Error(), "SQLSTATE 57014")
	if serverCanceled {
		if _, open := d.opened(); !open {
			t.Fatal("the connection was dropped after the server canceled the statement")
		}
	} else {
		t.Logf("the client deadline fired first: %v", err)
	}
	s.SetMetrics([]string{"custom.fast"}, map[string]string{"fast": "select 5"})
	if v := sampled(t, s, "custom.fast"); v != 5 {
		t.Errorf("custom.fast = %v, want 5", v)
	}
	if dials, _ := d.opened(); serverCanceled && dials != 1 {
		t.Errorf("%d connections opened: reconnected after a server-side timeout", dials)
	}
}

func TestPGLoopLifecycle(t *testing.T) {
	// Its own database, so that backends are counted by datname.
	dsn := pgtest.Shared(t).CreateDatabase(t)
	conn := pgConnect(t, dsn)
	s, logs, _ := pgSampler(t, dsn, health.Options{Interval: 100 * time.Millisecond, Metrics: []string{vocab.MetricActiveQueries}})
	if pids := healthBackends(t, conn); len(pids) != 0 {
		t.Fatalf("a sampler that was not started opened backends %v", pids)
	}
	s.Start()
	s.Start()

	// The loop samples, as a visible pgtraffic-health backend.
	var pid int32
	eventually(t, 5*time.Second, "the loop's backend appears", func() (bool, string) {
		pids := healthBackends(t, conn)
		if len(pids) == 1 {
			pid = pids[0]
		}
		return len(pids) == 1, fmt.Sprint(pids)
	})
	start := time.Now()
	eventually(t, 2*time.Second, "the loop samples every interval", func() (bool, string) {
		_, at, ok := s.Value(vocab.MetricActiveQueries)
		return ok && at.After(start), fmt.Sprint(at)
	})

	// A terminated backend is replaced by a new connection.
	if _, err := conn.Exec(context.Background(), "select pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	eventually(t, 5*time.Second, "the loop reconnects and samples", func() (bool, string) {
		// SampleOnce from another goroutine takes turns with the loop.
		_ = s.SampleOnce(context.Background())
		pids := healthBackends(t, conn)
		_, at, ok := s.Value(vocab.MetricActiveQueries)
		return len(pids) == 1 && pids[0] != pid && ok && at.After(killed), fmt.Sprint(pids, at)
	})
	if s.Errors() == 0 {
		t.Error("the lost connection was not counted")
	}
	if !strings.Contains(logs.String(), "SQLSTATE 57P01") && !strings.Contains(logs.String(), "connection lost") &&
		!strings.Contains(logs.String(), "EOF") {
		t.Errorf("the lost connection was not logged:\n%s", logs)
	}

	// An empty metric set closes the connection, and the loop opens nothing.
	s.SetMetrics(nil, nil)
	eventually(t, 5*time.Second, "no pgtraffic-health backend after SetMetrics(nil)", func() (bool, string) {
		pids := healthBackends(t, conn)
		return len(pids) == 0, fmt.Sprint(pids)
	})
	time.Sleep(300 * time.Millisecond) // three intervals of an idle loop
	if pids := healthBackends(t, conn); len(pids) != 0 {
		t.Fatalf("the idle loop reopened backends %v", pids)
	}

	// A reload that needs health metrics again reconnects at once.
	s.SetMetrics([]string{vocab.MetricActiveQueries}, nil)
	eventually(t, 5*time.Second, "the loop reconnects after a reload", func() (bool, string) {
		pids := healthBackends(t, conn)
		return len(pids) == 1, fmt.Sprint(pids)
	})
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	eventually(t, 5*time.Second, "Close closes the connection", func() (bool, string) {
		pids := healthBackends(t, conn)
		return len(pids) == 0, fmt.Sprint(pids)
	})
}
