package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// Health throttling end to end: throttle_when thresholds read by the connector's sampler from a
// real server, seen through Check, Wait and tagged statements.
//
// The health interval is short (healthInterval) to keep the tests fast. Nothing asserts a timing
// tighter than healthSettle: "within about two intervals" is the target, logged in intervals,
// and the bound only catches a budget that never flips on a starved machine.

const (
	healthInterval = 200 * time.Millisecond
	healthSettle   = 10 * time.Second // generous bound for "eventually"
	loadApp        = "pgtraffic-test-load"
)

// waitFor polls cond until it holds or timeout passes (then it fails t with cond's last
// description). It returns how long it took.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ok, state := cond()
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %v; last: %s", what, timeout, state)
		}
		time.Sleep(healthInterval / 8)
	}
}

// healthBlocked reports whether err is a health denial of budget whose limit contains limit,
// and describes err.
func healthBlocked(err error, budget, limit string) (bool, string) {
	var be *driver.BlockedError
	if errors.As(err, &be) && be.Reason == driver.ReasonHealth && be.Budget == budget && strings.Contains(be.Limit, limit) {
		return true, be.Error()
	}
	return false, fmt.Sprintf("%v", err)
}

// runTagged runs a statement that a health budget selects, retrying while the budget refuses
// it: a single health read can time out on a starved machine, and a refused statement was never
// sent, so retrying it is safe.
func runTagged(t *testing.T, db interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, ctx context.Context, query string) {
	t.Helper()
	waitFor(t, healthSettle, query, func() (bool, string) {
		_, err := db.ExecContext(ctx, query)
		if err != nil && !errors.Is(err, driver.ErrBlocked) {
			t.Fatalf("%s: %v", query, err)
		}
		return err == nil, fmt.Sprint(err)
	})
}

// assertHealthDenial checks the details of a health denial: the budget, the rule, the limit
// (a substring: the metric's name matches both a fresh reading over its threshold and a stale
// one, since on a starved machine a single read can time out) and a RetryAfter of about one
// interval.
func assertHealthDenial(t *testing.T, err error, budget, rule, limit string) {
	t.Helper()
	be := asBlocked(t, err)
	if be.Reason != driver.ReasonHealth || be.Budget != budget || be.Rule != rule {
		t.Errorf("denial %+v; want reason %s, budget %s, rule %s", be, driver.ReasonHealth, budget, rule)
	}
	if be.RetryAfter < healthInterval/2 || be.RetryAfter > 2*healthInterval {
		t.Errorf("RetryAfter = %v; want about one interval (%v)", be.RetryAfter, healthInterval)
	}
	if !strings.Contains(be.Limit, limit) || !strings.Contains(be.Error(), limit) {
		t.Errorf("denial limit %q (error %q); want it to name %q", be.Limit, be.Error(), limit)
	}
}

// load is a set of sessions outside pgtraffic, each running pg_sleep, so that the server has
// active queries pgtraffic did not send.
type load struct {
	t       *testing.T
	control *pgx.Conn
	wg      sync.WaitGroup
	once    sync.Once
}

// startLoad opens n plain pgx sessions on dsn, each running a long pg_sleep, and returns once the
// server shows all n active. Stop ends them; the test's cleanup stops them too.
func startLoad(t *testing.T, dsn string, n int) *load {
	t.Helper()
	ctx := context.Background()
	control, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	l := &load{t: t, control: control}
	t.Cleanup(l.Stop)
	for range n {
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["application_name"] = loadApp
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer conn.Close(context.Background())
			// Ended by Stop with pg_cancel_backend: 57014 is the expected outcome.
			_, _ = conn.Exec(ctx, "select pg_sleep(60)")
		}()
	}
	waitFor(t, healthSettle, "the load sessions are active", func() (bool, string) {
		active := l.active()
		return active == n, fmt.Sprintf("%d of %d load sessions active", active, n)
	})
	return l
}

func (l *load) active() int {
	var n int
	err := l.control.QueryRow(context.Background(),
		"select count(*) from pg_stat_activity where application_name = $1 and state = 'active'", loadApp).Scan(&n)
	if err != nil {
		l.t.Errorf("counting load sessions: %v", err)
	}
	return n
}

// Stop cancels the load's statements, waits until its sessions are closed and closes the
// control connection. It is idempotent.
func (l *load) Stop() {
	l.once.Do(func() {
		if _, err := l.control.Exec(context.Background(),
			"select pg_cancel_backend(pid) from pg_stat_activity where application_name = $1", loadApp); err != nil {
			l.t.Errorf("canceling the load: %v", err)
		}
		l.wg.Wait()
		l.control.Close(context.Background())
	})
}

// background runs an untagged statement through db every few milliseconds until stopped, to
// show that traffic no budget selects is never throttled.
type background struct {
	stop chan struct{}
	done chan struct{}
	runs atomic.Int64
	mu   sync.Mutex // protects errs
	errs []error
}

func startBackground(t *testing.T, db *sql.DB) *background {
	b := &background{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(b.done)
		for {
			select {
			case <-b.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if _, err := db.ExecContext(context.Background(), "select 1"); err != nil {
				b.mu.Lock()
				b.errs = append(b.errs, err)
				b.mu.Unlock()
			}
			b.runs.Add(1)
		}
	}()
	t.Cleanup(b.end)
	return b
}

func (b *background) end() {
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
	<-b.done
}

// TestHealthActiveQueriesThrottle: eight sessions of pg_sleep outside pgtraffic flip a budget
// with active_queries: 4 to throttled; Check, tagged statements, Wait and max_wait behave as the
// contract says while it is, and after the load ends; untagged traffic runs throughout.
func TestHealthActiveQueriesThrottle(t *testing.T) {
	c, db := openRules(t, `
health_interval: 200ms
budgets:
  - {name: batch, mode: enforce, throttle_when: {active_queries: 4}}
  - {name: patient, mode: enforce, max_wait: 30s, throttle_when: {active_queries: 4}}
rules:
  - {budget: batch, match: {job: import}}
  - {budget: patient, match: {job: patient}}
`)
	db.SetMaxOpenConns(12)
	ctx := context.Background()
	batch := tagging.With(ctx, "job", "import")
	patient := tagging.With(ctx, "job", "patient")
	if _, err := db.ExecContext(ctx, "create table probe (id int primary key)"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, healthSettle, "the first health sample admits the batch budget", func() (bool, string) {
		err := c.Check(batch)
		return err == nil, fmt.Sprint(err)
	})
	runTagged(t, db, batch, "select 1")
	bg := startBackground(t, db)

	// Eight sessions outside pgtraffic flip the budget to throttled.
	ld := startLoad(t, pgtest.Shared(t).DSN, 8)
	flip := waitFor(t, healthSettle, "Check refuses the batch under load", func() (bool, string) {
		return healthBlocked(c.Check(batch), "batch", "active_queries=")
	})
	t.Logf("throttled %v after the load was active (%.1f intervals)", flip.Round(time.Millisecond), float64(flip)/float64(healthInterval))

	t.Run("Check", func(t *testing.T) {
		assertHealthDenial(t, c.Check(batch), "batch", "job=import", "active_queries")
	})
	t.Run("tagged statement is blocked and never sent", func(t *testing.T) {
		before, beforeBudget := c.Snapshot().Counters.Blocked, budgetStatus(t, c, "batch").Blocked
		_, err := db.ExecContext(batch, "insert into probe values (1)")
		assertHealthDenial(t, err, "batch", "job=import", "active_queries")
		be := asBlocked(t, err)
		if be.Fingerprint == "" {
			t.Errorf("a blocked statement without a fingerprint: %+v", be)
		}
		s := c.Snapshot()
		if s.Counters.Blocked != before+1 {
			t.Errorf("blocked counter %d -> %d; want +1", before, s.Counters.Blocked)
		}
		if got := budgetStatus(t, c, "batch").Blocked; got != beforeBudget+1 {
			t.Errorf("budget batch blocked %d -> %d; want +1", beforeBudget, got)
		}
		if len(s.RecentBlocks) == 0 || s.RecentBlocks[0].Budget != "batch" || s.RecentBlocks[0].Reason != driver.ReasonHealth ||
			s.RecentBlocks[0].Fingerprint != be.Fingerprint {
			t.Errorf("recent blocks %+v; want the health block of batch first", s.RecentBlocks)
		}
	})
	t.Run("untagged statement runs", func(t *testing.T) {
		var n int
		if err := db.QueryRowContext(ctx, "select count(*) from probe").Scan(&n); err != nil || n != 0 {
			t.Fatalf("untagged count = %d, %v; want 0 (the blocked insert was never sent)", n, err)
		}
	})
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"Wait returns when ctx is canceled", func() (context.Context, context.CancelFunc) {
			wctx, cancel := context.WithCancel(batch)
			time.AfterFunc(3*healthInterval, cancel)
			return wctx, cancel
		}, context.Canceled},
		{"Wait returns at ctx's deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(batch, 3*healthInterval)
		}, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			err := c.Wait(wctx)
			took := time.Since(start)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Wait under load = %v; want %v", err, tc.want)
			}
			if took < 3*healthInterval || took > healthSettle {
				t.Errorf("Wait returned after %v; want when ctx ended (%v)", took, 3*healthInterval)
			}
		})
	}

	// While the load runs: eight jobs Wait, and a statement in a max_wait budget waits.
	const waiters = 8
	waited := make(chan time.Time, waiters)
	waitErrs := make(chan error, waiters)
	for range waiters {
		go func() {
			err := c.Wait(batch)
			waited <- time.Now()
			waitErrs <- err
		}()
	}
	type outcome struct {
		err error
		at  time.Time
	}
	patientDone := make(chan outcome, 1)
	go func() {
		_, err := db.ExecContext(patient, "insert into probe values (2)")
		patientDone <- outcome{err, time.Now()}
	}()
	select {
	case at := <-waited:
		t.Fatalf("a Wait returned at %v while the load ran", at)
	case o := <-patientDone:
		t.Fatalf("the max_wait statement returned while the load ran: %v", o.err)
	case <-time.After(5 * healthInterval):
	}

	ldEnd := time.Now()
	ld.Stop()
	recovered := waitFor(t, healthSettle, "Check admits the batch after the load", func() (bool, string) {
		err := c.Check(batch)
		return err == nil, fmt.Sprint(err)
	})
	t.Logf("admitted again %v after the load ended (%.1f intervals)", recovered.Round(time.Millisecond), float64(recovered)/float64(healthInterval))

	t.Run("every Wait returns once the load ends, spread by jitter", func(t *testing.T) {
		var times []time.Time
		for range waiters {
			select {
			case at := <-waited:
				if err := <-waitErrs; err != nil {
					t.Errorf("Wait = %v; want nil", err)
				}
				if at.Before(ldEnd) {
					t.Errorf("a Wait returned %v before the load ended", ldEnd.Sub(at))
				}
				times = append(times, at)
			case <-time.After(healthSettle):
				t.Fatalf("%d of %d Waits still waiting %v after the load ended", waiters-len(times), waiters, healthSettle)
			}
		}
		slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
		spread := times[len(times)-1].Sub(times[0])
		t.Logf("waiters resumed from %v to %v after the load ended (spread %v)",
			times[0].Sub(ldEnd).Round(time.Millisecond), times[len(times)-1].Sub(ldEnd).Round(time.Millisecond), spread.Round(time.Millisecond))
		// Backoff draws each sleep from [ceiling/2, ceiling) with ceilings of one to four
		// intervals, so eight waiters resume over hundreds of milliseconds, not at one instant.
		if spread < 10*time.Millisecond {
			t.Errorf("all %d waiters resumed within %v: no jitter", waiters, spread)
		}
	})
	t.Run("max_wait statement waits and succeeds", func(t *testing.T) {
		select {
		case o := <-patientDone:
			if o.err != nil {
				t.Fatalf("max_wait statement = %v; want success after the load ended", o.err)
			}
			if o.at.Before(ldEnd) {
				t.Errorf("the max_wait statement finished %v before the load ended", ldEnd.Sub(o.at))
			}
		case <-time.After(healthSettle):
			t.Fatal("the max_wait statement still waiting after the load ended")
		}
	})
	t.Run("tagged statements run again", func(t *testing.T) {
		runTagged(t, db, batch, "insert into probe values (3)")
		var ids []int
		rows, err := db.QueryContext(ctx, "select id from probe order by id")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var id int
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if !slices.Equal(ids, []int{2, 3}) {
			t.Errorf("probe holds %v; want [2 3] (1 was blocked)", ids)
		}
	})
	t.Run("untagged traffic was never throttled", func(t *testing.T) {
		bg.end()
		if bg.runs.Load() == 0 || len(bg.errs) != 0 {
			t.Fatalf("untagged statements: %d runs, errors %v", bg.runs.Load(), bg.errs)
		}
		t.Logf("%d untagged statements ran during the test", bg.runs.Load())
	})
}

// TestHealthReplicationLag: a budget with replication_lag, on a connector pointed at a real
// standby (pg_basebackup -R), throttles while replay is paused and the primary writes, and
// recovers after replay resumes.
func TestHealthReplicationLag(t *testing.T) {
	primary := privateServer(t)
	standby, err := primary.StartStandby()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop() })
	ctx := context.Background()

	// Writes go to the primary on plain pgx; pgtraffic and its sampler are on the standby,
	// where the lag is read.
	pconn, err := pgx.Connect(ctx, primary.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pconn.Close(context.Background()) })
	if _, err := pconn.Exec(ctx, "create table lag_probe (id bigserial primary key)"); err != nil {
		t.Fatal(err)
	}
	sconn, err := pgx.Connect(ctx, standby.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sconn.Close(context.Background()) })

	cfg, err := driver.ParseConfig([]byte(`
health_interval: 200ms
budgets:
  - {name: replica-reads, mode: enforce, throttle_when: {replication_lag: 1s}}
rules:
  - {budget: replica-reads, match: {job: report}}
`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := driver.NewConnector(standby.DSN, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { db.Close() })
	report := tagging.With(ctx, "job", "report")

	waitFor(t, healthSettle, "the standby replays the table and the budget admits", func() (bool, string) {
		var n int
		if err := db.QueryRowContext(report, "select count(*) from lag_probe").Scan(&n); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	if err := c.Check(report); err != nil {
		t.Fatalf("Check on a caught-up standby: %v", err)
	}

	if _, err := sconn.Exec(ctx, "select pg_wal_replay_pause()"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sconn.Exec(context.Background(), "select pg_wal_replay_resume()") })
	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		for {
			if _, err := pconn.Exec(ctx, "insert into lag_probe default values"); err != nil {
				writerDone <- err
				return
			}
			select {
			case <-stop:
				writerDone <- nil
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	var stopOnce sync.Once
	var writerErr error
	stopWriter := func() error {
		stopOnce.Do(func() { close(stop); writerErr = <-writerDone })
		return writerErr
	}
	t.Cleanup(func() { stopWriter() })

	flip := waitFor(t, healthSettle, "Check refuses replica reads while replay is paused", func() (bool, string) {
		return healthBlocked(c.Check(report), "replica-reads", "replication_lag=")
	})
	t.Logf("throttled %v after replay was paused", flip.Round(time.Millisecond))
	assertHealthDenial(t, c.Check(report), "replica-reads", "job=report", "replication_lag")
	_, err = db.ExecContext(report, "select count(*) from lag_probe")
	assertHealthDenial(t, err, "replica-reads", "job=report", "replication_lag")
	var stale int64
	if err := db.QueryRowContext(ctx, "select count(*) from lag_probe").Scan(&stale); err != nil {
		t.Fatalf("an untagged read on the lagging standby: %v", err)
	}

	if err := stopWriter(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	var written int64
	if err := pconn.QueryRow(ctx, "select count(*) from lag_probe").Scan(&written); err != nil {
		t.Fatal(err)
	}
	if stale >= written {
		t.Errorf("the paused standby saw %d rows of %d: replay was not paused", stale, written)
	}
	if _, err := sconn.Exec(ctx, "select pg_wal_replay_resume()"); err != nil {
		t.Fatal(err)
	}
	recovered := waitFor(t, healthSettle, "Check admits replica reads after replay resumes", func() (bool, string) {
		err := c.Check(report)
		return err == nil, fmt.Sprint(err)
	})
	t.Logf("admitted again %v after replay resumed", recovered.Round(time.Millisecond))
	waitFor(t, healthSettle, "a tagged read sees every row written", func() (bool, string) {
		var n int64
		err := db.QueryRowContext(report, "select count(*) from lag_probe").Scan(&n)
		return err == nil && n == written, fmt.Sprintf("%d of %d rows, %v", n, written, err)
	})
}

// TestHealthStaleSampleFailsSafe: when health cannot be read, an enforce budget counts it as
// exceeded (fail safe) and the log says so once; a warn budget is not warned about it.
func TestHealthStaleSampleFailsSafe(t *testing.T) {
	t.Run("server stopped under the connector", func(t *testing.T) {
		srv := privateServer(t)
		cfg, err := driver.ParseConfig([]byte(`
health_interval: 200ms
budgets:
  - {name: batch, mode: enforce, throttle_when: {active_queries: 1000}}
rules:
  - {budget: batch, match: {job: import}}
`))
		if err != nil {
			t.Fatal(err)
		}
		var logs lockedBuffer
		c, err := driver.NewConnector(srv.DSN, driver.WithConfig(cfg), driver.WithLogger(logs.logger()))
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(c)
		t.Cleanup(func() { db.Close() })
		ctx := context.Background()
		batch := tagging.With(ctx, "job", "import")
		waitFor(t, healthSettle, "the first health sample admits the batch", func() (bool, string) {
			err := c.Check(batch)
			return err == nil, fmt.Sprint(err)
		})
		// A connection held across the stop, so that a statement reaches the interceptor
		// rather than failing to connect.
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		runTagged(t, conn, batch, "select 1")

		mark := len(logs.String())
		if err := srv.Stop(); err != nil {
			t.Fatal(err)
		}
		flip := waitFor(t, healthSettle, "Check refuses the batch once health cannot be read", func() (bool, string) {
			return healthBlocked(c.Check(batch), "batch", "sample is stale")
		})
		t.Logf("throttled %v after the server stopped", flip.Round(time.Millisecond))
		// Many checks over several intervals: still refused, and the staleness logged once.
		for deadline := time.Now().Add(5 * healthInterval); time.Now().Before(deadline); time.Sleep(healthInterval / 4) {
			assertHealthDenial(t, c.Check(batch), "batch", "job=import", "active_queries sample is stale (no recent reading")
		}
		_, err = conn.ExecContext(batch, "select 1")
		assertHealthDenial(t, err, "batch", "job=import", "active_queries sample is stale")
		// Untagged statements are not pgtraffic's to refuse: they fail at the dead server.
		if _, err := conn.ExecContext(ctx, "select 1"); err == nil || errors.Is(err, driver.ErrBlocked) {
			t.Errorf("untagged statement on a stopped server = %v; want a connection error, not a block", err)
		}
		after := logs.String()[mark:]
		if n := strings.Count(after, "health: metric is stale"); n != 1 || !strings.Contains(after, "metric=active_queries") {
			t.Errorf("staleness logged %d times, want once naming active_queries:\n%s", n, after)
		}
	})

	t.Run("custom query that cannot be read", func(t *testing.T) {
		var logs lockedBuffer
		c, db := openRules(t, `
health_interval: 100ms
health_queries: {broken: "select count(*) from no_such_table"}
budgets:
  - {name: guarded, mode: enforce, throttle_when: {custom.broken: 10}}
  - {name: watched, mode: warn, throttle_when: {custom.broken: 10}}
rules:
  - {budget: guarded, match: {job: import}}
  - {budget: watched, match: {job: report}}
`, driver.WithLogger(logs.logger()))
		ctx := context.Background()
		batch := tagging.With(ctx, "job", "import")
		report := tagging.With(ctx, "job", "report")
		waitFor(t, healthSettle, "the sampler reads and fails", func() (bool, string) {
			return contains(logs.String(), "undefined_table"), logs.String()
		})
		for range 10 {
			assertHealthDenial(t, c.Check(batch), "guarded", "job=import", "custom.broken sample is stale")
			time.Sleep(healthInterval / 2) // several failed rounds
		}
		_, err := db.ExecContext(batch, "select 1")
		assertHealthDenial(t, err, "guarded", "job=import", "custom.broken sample is stale")
		// A warn budget is not warned about what is not known, and its statements run.
		if err := c.Check(report); err != nil {
			t.Errorf("Check of a warn budget = %v; want nil", err)
		}
		if _, err := db.ExecContext(report, "select 1"); err != nil {
			t.Errorf("statement in a warn budget with a stale metric: %v", err)
		}
		if w := budgetStatus(t, c, "watched").Warned; w != 0 {
			t.Errorf("warn budget warned %d times about a stale metric; want 0", w)
		}
		out := logs.String()
		if n := strings.Count(out, "health: metric is stale"); n != 1 {
			t.Errorf("staleness logged %d times, want once:\n%s", n, out)
		}
		// A failure is logged when it begins or changes (on a loaded machine a round may time out
		// between two that find no table), never again while it stays the same.
		var failures []string
		for line := range strings.Lines(out) {
			if strings.Contains(line, "health: metric read failed") {
				failures = append(failures, line[strings.Index(line, "error="):])
			}
		}
		if len(failures) == 0 || !strings.Contains(failures[0], "undefined_table") {
			t.Errorf("the read failure logged %d times, want a first one naming undefined_table:\n%s", len(failures), out)
		}
		for i := 1; i < len(failures); i++ {
			if failures[i] == failures[i-1] {
				t.Errorf("the same read failure logged twice in a row:\n%s", out)
				break
			}
		}
	})
}
