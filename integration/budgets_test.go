package integration

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// openRules opens a pgtraffic connector with the given rules on a fresh database.
func openRules(t *testing.T, rules string, opts ...driver.Option) (*driver.Connector, *sql.DB) {
	t.Helper()
	dsn := pgtest.Shared(t).CreateDatabase(t)
	cfg, err := driver.ParseConfig([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	c, err := driver.NewConnector(dsn, append([]driver.Option{driver.WithConfig(cfg)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { db.Close() })
	return c, db
}

func budgetStatus(t *testing.T, c *driver.Connector, name string) driver.BudgetStatus {
	t.Helper()
	for _, b := range c.Snapshot().Budgets {
		if b.Name == name {
			return b
		}
	}
	t.Fatalf("no budget %q", name)
	return driver.BudgetStatus{}
}

func asBlocked(t *testing.T, err error) *driver.BlockedError {
	t.Helper()
	var be *driver.BlockedError
	if !errors.As(err, &be) || !errors.Is(err, driver.ErrBlocked) {
		t.Fatalf("want *driver.BlockedError, got %T %v", err, err)
	}
	if be.SQLState() != "53000" {
		t.Fatalf("SQLState %q", be.SQLState())
	}
	return be
}

func TestMaxConcurrentBurst(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: slow, mode: enforce, max_concurrent: 3}
rules:
  - {budget: slow, match: {app: batch}}
`)
	db.SetMaxOpenConns(20)
	ctx := tagging.With(context.Background(), "app", "batch")
	var ok, blockedN atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := db.ExecContext(ctx, "select pg_sleep(0.5)")
			if err == nil {
				ok.Add(1)
				return
			}
			be := asBlocked(t, err)
			if be.Reason != driver.ReasonConcurrency || be.Budget != "slow" || be.RetryAfter <= 0 {
				t.Errorf("blocked with %+v", be)
			}
			blockedN.Add(1)
		}()
	}
	close(start)
	wg.Wait()
	if ok.Load() != 3 || blockedN.Load() != 9 {
		t.Fatalf("admitted %d blocked %d; want 3 and 9", ok.Load(), blockedN.Load())
	}
	// Untagged traffic is not in the budget.
	if _, err := db.Exec("select pg_sleep(0.01)"); err != nil {
		t.Fatal(err)
	}
	if b := budgetStatus(t, c, "slow"); b.InFlight != 0 || b.Blocked != 9 || b.Admitted != 3 {
		t.Fatalf("budget after the burst: %+v", b)
	}
}

// TestSlotsNeverLeak runs statements that end every way a statement can end and checks that
// every concurrency slot came back.
func TestSlotsNeverLeak(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: b, mode: enforce, max_concurrent: 2}
rules:
  - {budget: b, match: {statement: select}}
`)
	ctx := context.Background()
	// Exec and Query, success.
	db.ExecContext(ctx, "select 1")
	rows, _ := db.QueryContext(ctx, "select generate_series(1, 10)")
	for rows.Next() {
	}
	rows.Close()
	// Rows closed early.
	rows, _ = db.QueryContext(ctx, "select generate_series(1, 100000)")
	rows.Next()
	rows.Close()
	// Server errors, at execute and mid-rows.
	db.ExecContext(ctx, "select 1/0")
	rows, err := db.QueryContext(ctx, "select 1/(g-5) from generate_series(1,10) g")
	if err == nil {
		for rows.Next() {
		}
		if rows.Err() == nil {
			t.Error("want a division by zero mid-rows")
		}
		rows.Close()
	}
	// Cancelled contexts: before, during Exec, during Rows.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	db.ExecContext(cctx, "select 1")
	tctx, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	db.ExecContext(tctx, "select pg_sleep(2)")
	cancel2()
	qctx, cancel3 := context.WithCancel(ctx)
	rows, err = db.QueryContext(qctx, "select pg_sleep(0.01), g from generate_series(1, 1000) g")
	if err == nil {
		rows.Next()
		cancel3()
		for rows.Next() {
		}
		rows.Close()
	}
	cancel3()
	// Prepared statements and transactions.
	st, _ := db.Prepare("select $1::int")
	st.Exec(1)
	st.Close()
	tx, _ := db.Begin()
	tx.Exec("select 1")
	tx.Rollback()
	// A broken connection: the server kills our backend mid-statement.
	conn, _ := db.Conn(ctx)
	var pid int
	conn.QueryRowContext(ctx, "select pg_backend_pid()").Scan(&pid)
	go func() {
		time.Sleep(100 * time.Millisecond)
		raw, err := sql.Open("pgx", pgtest.Shared(t).DSN)
		if err == nil {
			raw.Exec("select pg_terminate_backend($1)", pid)
			raw.Close()
		}
	}()
	if _, err := conn.ExecContext(ctx, "select pg_sleep(3)"); err == nil {
		t.Error("want an error from a terminated backend")
	}
	conn.Close()

	if b := budgetStatus(t, c, "b"); b.InFlight != 0 {
		t.Fatalf("leaked %d slots: %+v", b.InFlight, b)
	}
	// And the budget still admits two at once.
	var wg sync.WaitGroup
	var fails atomic.Int32
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := db.Exec("select pg_sleep(0.2)"); err != nil {
				fails.Add(1)
			}
		}()
	}
	wg.Wait()
	if fails.Load() != 0 {
		t.Fatalf("%d of 2 statements failed after the leak check", fails.Load())
	}
}

func TestTagsFromCommentsAndContext(t *testing.T) {
	_, db := openRules(t, `
budgets:
  - {name: blocked, mode: enforce, per_query_limit: 1ms}
  - {name: allowed, mode: off}
rules:
  - {budget: blocked, match: {controller: export}}
`)
	// A statement costs > 1ms once history exists; use pg_sleep to build it.
	ctx := context.Background()
	q := "select pg_sleep(0.01) /*controller='export'*/"
	db.ExecContext(ctx, q) // first: no history, admitted
	_, err := db.ExecContext(ctx, q)
	if be := asBlocked(t, err); be.Reason != driver.ReasonPerQuery || be.Rule != "controller=export" {
		t.Fatalf("comment tag: %+v", be)
	}
	// Context wins over the comment: the context says controller=api.
	if _, err := db.ExecContext(tagging.With(ctx, "controller", "api"), q); err != nil {
		t.Fatalf("context tag should override the comment: %v", err)
	}
	// A context tag alone selects the budget too.
	_, err = db.ExecContext(tagging.With(ctx, "controller", "export"), "select pg_sleep(0.01)")
	if err == nil {
		_, err = db.ExecContext(tagging.With(ctx, "controller", "export"), "select pg_sleep(0.01)")
	}
	asBlocked(t, err)
}

func TestWarnModeRunsAndLogs(t *testing.T) {
	var logs lockedBuffer
	c, db := openRules(t, `
budgets:
  - {name: w, mode: warn, max_concurrent: 1}
rules:
  - {budget: w, match: {app: web}}
`, driver.WithLogger(logs.logger()))
	ctx := tagging.With(context.Background(), "app", "web")
	var wg sync.WaitGroup
	var fails atomic.Int32
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := db.ExecContext(ctx, "select pg_sleep(0.3)"); err != nil {
				fails.Add(1)
			}
		}()
	}
	wg.Wait()
	if fails.Load() != 0 {
		t.Fatalf("warn mode failed %d statements", fails.Load())
	}
	out := logs.String()
	for _, want := range []string{"budget=w", "reason=concurrency", "fingerprint="} {
		if !contains(out, want) {
			t.Fatalf("warn log lacks %q:\n%s", want, out)
		}
	}
	if c.Snapshot().Counters.Warned < 3 {
		t.Fatalf("warned %d, want >= 3", c.Snapshot().Counters.Warned)
	}
}

func TestPartitionedBudget(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: tenants, mode: enforce, per: tenant, max_concurrent: 1}
rules:
  - {budget: tenants, match: {app: saas}}
`)
	db.SetMaxOpenConns(10)
	run := func(tenant string) error {
		_, err := db.ExecContext(tagging.With(context.Background(), "app", "saas", "tenant", tenant), "select pg_sleep(0.4)")
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i, tenant := range []string{"a", "a", "b", "c"} {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = run(tenant) }()
		if i == 0 {
			time.Sleep(50 * time.Millisecond) // tenant a's first statement is in flight first
		}
	}
	wg.Wait()
	if errs[2] != nil || errs[3] != nil {
		t.Fatalf("tenants b and c must run: %v", errs)
	}
	// Exactly one of tenant a's two overlapping statements runs.
	aBlocked := errs[0]
	if aBlocked == nil {
		aBlocked = errs[1]
	} else if errs[1] != nil {
		t.Fatalf("both of tenant a's statements were blocked: %v", errs)
	}
	if be := asBlocked(t, aBlocked); be.Reason != driver.ReasonConcurrency {
		t.Fatalf("second statement of tenant a: %+v", be)
	}
	if b := budgetStatus(t, c, "tenants"); b.Keys < 3 {
		t.Fatalf("want a state per tenant: %+v", b)
	}
}

func TestBucketExhaustionAndRecovery(t *testing.T) {
	c, db := openRules(t, `
server_cores: 1
budgets:
  - {name: reports, mode: enforce, server_share: 0.5, burst_limit: 300ms}
rules:
  - {budget: reports, match: {app: reports}}
`)
	ctx := tagging.With(context.Background(), "app", "reports")
	var be *driver.BlockedError
	for i := 0; i < 20 && be == nil; i++ {
		_, err := db.ExecContext(ctx, "select pg_sleep(0.1)")
		if err != nil {
			be = asBlocked(t, err)
		}
	}
	if be == nil {
		t.Fatal("20 x 100ms never filled a 300ms bucket")
	}
	if be.Reason != driver.ReasonBudget || be.RetryAfter <= 0 || be.RetryAfter > time.Second {
		t.Fatalf("bucket block: %+v", be)
	}
	if b := budgetStatus(t, c, "reports"); b.Debt <= 0.1 {
		t.Fatalf("debt after exhaustion: %+v", b)
	}
	time.Sleep(be.RetryAfter + 20*time.Millisecond)
	if _, err := db.ExecContext(ctx, "select pg_sleep(0.1)"); err != nil {
		t.Fatalf("after RetryAfter: %v", err)
	}
}

func TestBlockedInsertNeverReachesTable(t *testing.T) {
	_, db := openRules(t, `
budgets:
  - {name: frozen, mode: enforce, per_query_limit: 1us}
rules:
  - {budget: frozen, match: {table: audit, statement: insert}}
`)
	if _, err := db.Exec("create table audit (id int, note text)"); err != nil {
		t.Fatal(err)
	}
	// A new pattern with no history may slip under the limit once (its prediction comes from the
	// global k); after that every insert is blocked, and none of the blocked ones is executed.
	ran, blockedN := 0, 0
	for i := range 5 {
		_, err := db.Exec("insert into audit values ($1, 'x')", i)
		if err == nil {
			ran++
			continue
		}
		asBlocked(t, err)
		blockedN++
	}
	if blockedN < 4 {
		t.Fatalf("blocked %d of 5 inserts", blockedN)
	}
	var n int
	if err := db.QueryRow("select count(*) from audit").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != ran {
		t.Fatalf("%d rows in the table, %d inserts admitted: blocked inserts reached it", n, ran)
	}
	// The server never executed them either: pg_stat_user_tables counts only the admitted ones.
	var ins int64
	db.Exec("select pg_stat_force_next_flush()")
	if err := db.QueryRow("select coalesce(n_tup_ins, 0) from pg_stat_user_tables where relname = 'audit'").Scan(&ins); err != nil {
		t.Fatal(err)
	}
	if ins != int64(ran) {
		t.Fatalf("server counted %d inserts, %d admitted", ins, ran)
	}
}

func TestRulesFileReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	write := func(content string) {
		tmp := filepath.Join(dir, ".rules.tmp")
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil { // an atomic swap, as editors and deploy tools do
			t.Fatal(err)
		}
	}
	open := `
budgets:
  - {name: gate, mode: enforce, max_concurrent: 5}
rules:
  - {budget: gate, match: {app: gated}}
`
	closed := `
budgets:
  - {name: gate, mode: enforce, max_concurrent: 5, per_query_limit: 1us}
rules:
  - {budget: gate, match: {app: gated}}
`
	write(open)
	var logs lockedBuffer
	dsn := pgtest.Shared(t).CreateDatabase(t)
	c, err := driver.NewConnector(dsn, driver.WithRulesFile(path), driver.WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	defer db.Close()
	ctx := tagging.With(context.Background(), "app", "gated")
	if _, err := db.ExecContext(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	write(closed)
	if !eventually(10*time.Second, func() bool {
		_, err := db.ExecContext(ctx, "select 1")
		return errors.Is(err, driver.ErrBlocked)
	}) {
		t.Fatal("the swapped rules file was not applied within 10s")
	}
	// A broken file keeps the last good rules (still blocking) and is logged and counted.
	write("budgets:\n  - {name: gate, max_concurent: 5}\n")
	if !eventually(10*time.Second, func() bool { return c.Snapshot().Counters.ReloadFailures > 0 }) {
		t.Fatal("the broken rules file was not reported")
	}
	if _, err := db.ExecContext(ctx, "select 1"); !errors.Is(err, driver.ErrBlocked) {
		t.Fatalf("after a broken file the last good rules must stay: %v", err)
	}
	if !contains(logs.String(), "max_concurent") {
		t.Fatalf("the reload error does not name the field:\n%s", logs.String())
	}
	// Kubernetes ConfigMap style: the file is a symlink to ..data/rules.yaml, swapped by renaming ..data.
	kdir := t.TempDir()
	mk := func(name, content string) {
		d := filepath.Join(kdir, name)
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "rules.yaml"), []byte(content), 0o644)
	}
	mk("..v1", closed)
	os.Symlink("..v1", filepath.Join(kdir, "..data"))
	os.Symlink("..data/rules.yaml", filepath.Join(kdir, "rules.yaml"))
	c2, err := driver.NewConnector(dsn, driver.WithRulesFile(filepath.Join(kdir, "rules.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	db2 := sql.OpenDB(c2)
	defer db2.Close()
	db2.ExecContext(ctx, "select 1") // a new pattern may slip under 1us; its history will not
	if _, err := db2.ExecContext(ctx, "select 1"); !errors.Is(err, driver.ErrBlocked) {
		t.Fatalf("configmap v1 should block: %v", err)
	}
	mk("..v2", open)
	os.Symlink("..v2", filepath.Join(kdir, "..data_tmp"))
	os.Rename(filepath.Join(kdir, "..data_tmp"), filepath.Join(kdir, "..data"))
	if !eventually(10*time.Second, func() bool {
		_, err := db2.ExecContext(ctx, "select 1")
		return err == nil
	}) {
		t.Fatal("the ConfigMap symlink swap was not applied within 10s")
	}
}

func TestMissingOrInvalidRulesFile(t *testing.T) {
	dsn := pgtest.Shared(t).DSN
	if _, err := driver.NewConnector(dsn, driver.WithRulesFile(filepath.Join(t.TempDir(), "nope.yaml"))); err == nil {
		t.Fatal("a missing rules file must be an error")
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("budgets:\n  - name: x\n    max_concurent: 1\n"), 0o644)
	_, err := driver.NewConnector(dsn, driver.WithRulesFile(bad))
	if err == nil || !contains(err.Error(), "max_concurent") || !contains(err.Error(), "line 3") {
		t.Fatalf("invalid rules file: %v", err)
	}
	t.Setenv("PGTRAFFIC_RULES", bad)
	db, err := sql.Open("pgtraffic", dsn)
	if err == nil {
		err = db.Ping()
		db.Close()
	}
	if err == nil {
		t.Fatal("sql.Open with an invalid PGTRAFFIC_RULES must fail")
	}
}

func TestPlainSQLOpenWithEnvRules(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	os.WriteFile(path, []byte(`{"budgets":[{"name":"none","mode":"enforce","per_query_limit":"1us"}],"rules":[{"budget":"none","match":{"app":"env"}}]}`), 0o644)
	t.Setenv("PGTRAFFIC_RULES", path)
	db, err := sql.Open("pgtraffic", pgtest.Shared(t).DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("select 1"); err != nil {
		t.Fatal(err)
	}
	ctx := tagging.With(context.Background(), "app", "env")
	_, err = db.ExecContext(ctx, "select count(*) from pg_class")
	if err == nil {
		_, err = db.ExecContext(ctx, "select count(*) from pg_class")
	}
	asBlocked(t, err)
}

// mustEventually fails t unless f holds within 10 s; what names the condition.
func mustEventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	if !eventually(10*time.Second, f) {
		t.Fatalf("%s: not reached in 10 s", what)
	}
}

func eventually(d time.Duration, f func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if f() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return f()
}

// TestCloseStopsWatcherAndSampler: (*sql.DB).Close stops what the connector started: the rules
// file is no longer watched and the health sampler's connection is closed.
func TestCloseStopsWatcherAndSampler(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	rules := `
health_interval: 100ms
budgets:
  - {name: batch, mode: enforce, throttle_when: {active_queries: 1000}}
rules:
  - {budget: batch, match: {job: import}}
`
	if err := os.WriteFile(path, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := driver.NewConnector(dsn, driver.WithRulesFile(path))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	if _, err := db.Exec("select 1"); err != nil {
		t.Fatal(err)
	}
	raw, err := sql.Open("pgx", dsn) // the sampler connects to the test database
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	samplers := func() int {
		var n int
		if err := raw.QueryRow(`select count(*) from pg_stat_activity where application_name = 'pgtraffic-health'
			and datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if !eventually(5*time.Second, func() bool { return samplers() == 1 }) {
		t.Fatalf("the health sampler did not connect: %d connections", samplers())
	}
	reloads := c.Snapshot().Counters.Reloads
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if !eventually(5*time.Second, func() bool { return samplers() == 0 }) {
		t.Fatalf("the health sampler's connection outlived db.Close: %d", samplers())
	}
	if err := os.WriteFile(path, []byte(rules+"\n# changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // a watcher would have reloaded by now (within a second)
	if got := c.Snapshot().Counters.Reloads; got != reloads {
		t.Fatalf("the rules file was reloaded after db.Close (%d -> %d reloads)", reloads, got)
	}
}
