package integration

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// openRulesOn opens a pgtraffic connector with the given rules on database dsn.
func openRulesOn(t *testing.T, dsn, rules string) (*driver.Connector, *sql.DB) {
	t.Helper()
	cfg, err := driver.ParseConfig([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	c, err := driver.NewConnector(dsn, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { db.Close() })
	return c, db
}

// TestZeroLimitsBlockWhatTheyMatch: max_concurrent: 0 and server_share: 0 refuse every statement
// their rules match, before it is sent, and nothing else; an omitted limit is unlimited.
func TestZeroLimitsBlockWhatTheyMatch(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: closed, mode: enforce, max_concurrent: 0}
  - {name: dry, mode: enforce, server_share: 0}
  - {name: open, mode: enforce, per_query_limit: 10s}
rules:
  - {budget: closed, match: {tenant: noisy}}
  - {budget: dry, match: {controller: export}}
  - {budget: open, match: {app: shop}}
`)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "create table hits (n int)"); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		tags           []string
		budget, reason string
	}{
		{[]string{"tenant", "noisy", "app", "shop"}, "closed", driver.ReasonConcurrency},
		{[]string{"controller", "export"}, "dry", driver.ReasonBudget},
	} {
		_, err := db.ExecContext(tagging.With(ctx, tt.tags...), "insert into hits values (1)")
		be := asBlocked(t, err)
		if be.Budget != tt.budget || be.Reason != tt.reason || be.RetryAfter != 0 {
			t.Errorf("%v: %+v", tt.tags, be)
		}
	}
	for _, tags := range [][]string{{"tenant", "quiet", "app", "shop"}, {"controller", "checkout"}, {}} {
		if _, err := db.ExecContext(tagging.With(ctx, tags...), "insert into hits values (2)"); err != nil {
			t.Errorf("%v: %v", tags, err)
		}
	}
	var ones, twos int
	if err := db.QueryRowContext(ctx, "select count(*) filter (where n = 1), count(*) filter (where n = 2) from hits").Scan(&ones, &twos); err != nil {
		t.Fatal(err)
	}
	if ones != 0 || twos != 3 {
		t.Errorf("rows inserted: %d refused ones, %d admitted twos; want 0 and 3", ones, twos)
	}
	if b := budgetStatus(t, c, "closed"); b.Blocked != 1 {
		t.Errorf("closed: blocked %d, want 1", b.Blocked)
	}
}

// TestRuleUntilLapsesWithoutReload: a rule whose until is two seconds ahead blocks, then stops
// blocking with no reload; one whose until has passed never applies.
func TestRuleUntilLapsesWithoutReload(t *testing.T) {
	until := time.Now().Add(2 * time.Second).UTC().Format(time.RFC3339Nano)
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	c, db := openRules(t, `
budgets:
  - {name: block, mode: enforce, max_concurrent: 0}
rules:
  - {budget: block, match: {tenant: noisy}, until: "`+until+`"}
  - {budget: block, match: {tenant: old}, until: "`+past+`"}
`)
	ctx := context.Background()
	noisy := tagging.With(ctx, "tenant", "noisy")
	if _, err := db.ExecContext(tagging.With(ctx, "tenant", "old"), "select 1"); err != nil {
		t.Fatalf("a lapsed rule applied: %v", err)
	}
	if _, err := db.ExecContext(noisy, "select 1"); asBlocked(t, err).Budget != "block" {
		t.Fatalf("not blocked by the rule: %v", err)
	}
	reloads := c.Snapshot().Counters.Reloads
	if !eventually(5*time.Second, func() bool {
		_, err := db.ExecContext(noisy, "select 1")
		return err == nil
	}) {
		t.Fatal("the rule still blocks after its until")
	}
	if n := c.Snapshot().Counters.Reloads; n != reloads {
		t.Fatalf("reloads: %d, then %d", reloads, n)
	}
}

// TestMaxDurationCancelsOnTheServer: a statement of an enforce budget still running past its
// max_duration, its rows included, is cancelled on the server, and its error matches
// driver.ErrOverrun and context.DeadlineExceeded; statements within the bound, and of other
// budgets, are untouched.
func TestMaxDurationCancelsOnTheServer(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	c, db := openRulesOn(t, dsn, `
budgets:
  - {name: bounded, mode: enforce, max_duration: 300ms}
  - {name: loose, mode: enforce, max_duration: 10s}
  - {name: watched, mode: warn, max_duration: 100ms}
rules:
  - {budget: bounded, match: {app: reports}}
  - {budget: loose, match: {app: reports, tier: gold}}
  - {budget: loose, match: {app: batch}}
  - {budget: watched, match: {app: audit}}
`)
	ctx := context.Background()
	reports := tagging.With(ctx, "app", "reports")
	overrun := func(name string, err error, took time.Duration) {
		t.Helper()
		if !errors.Is(err, driver.ErrOverrun) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: error %v, want ErrOverrun and DeadlineExceeded", name, err)
		}
		if took > time.Second {
			t.Errorf("%s: returned after %v", name, took)
		}
		// The server stopped it: no backend still runs it.
		raw := openRaw(t, dsn)
		var n int
		if !eventually(2*time.Second, func() bool {
			err := raw.QueryRowContext(ctx, "select count(*) from pg_stat_activity where state = 'active' and query like '%pg_sleep%' and pid <> pg_backend_pid()").Scan(&n)
			return err == nil && n == 0
		}) {
			t.Errorf("%s: %d backends still running it", name, n)
		}
	}

	t0 := time.Now()
	_, err := db.ExecContext(reports, "select pg_sleep(5)")
	overrun("exec", err, time.Since(t0))

	// The smallest bound applies: reports with tier gold are in both budgets.
	t0 = time.Now()
	_, err = db.ExecContext(tagging.With(reports, "tier", "gold"), "select pg_sleep(5)")
	overrun("two budgets", err, time.Since(t0))

	// Rows that take 2 s to read: each is quick, the whole is not. The server buffers small
	// rows, so the error may come when the query opens or while its rows are read; rows of
	// 64 kB each are sent as they are made, so the second query's rows begin to arrive and
	// the cancel comes while they are read.
	for _, q := range []string{
		"select pg_sleep(0.1) from generate_series(1, 20)",
		"select repeat('x', 65536), pg_sleep(0.1) from generate_series(1, 20)",
	} {
		t0 = time.Now()
		n := 0
		rows, err := db.QueryContext(reports, q)
		if err == nil {
			for rows.Next() {
				n++
			}
			err = rows.Err()
			rows.Close()
		}
		overrun(q, err, time.Since(t0))
		if n >= 20 || strings.Contains(q, "repeat") && n == 0 {
			t.Errorf("%s: read %d rows before the cancel", q, n)
		}
	}

	// Within the bound, another budget's bound, a warn budget's bound: untouched.
	for _, tt := range []struct {
		ctx context.Context
		sql string
	}{
		{reports, "select pg_sleep(0.05)"},
		{tagging.With(ctx, "app", "batch"), "select pg_sleep(0.5)"},
		{tagging.With(ctx, "app", "audit"), "select pg_sleep(0.3)"},
		{ctx, "select pg_sleep(0.5)"},
	} {
		if _, err := db.ExecContext(tt.ctx, tt.sql); err != nil {
			t.Errorf("%s: %v", tt.sql, err)
		}
	}
	if b := budgetStatus(t, c, "watched"); b.Warned != 1 {
		t.Errorf("warn budget: warned %d, want 1", b.Warned)
	}
}

// TestQuarantineAfterOverruns: a pattern that overran max_duration twice under
// quarantine: {after: 2, for: 30s} is refused at once, reason quarantine, RetryAfter about 30 s,
// before anything is sent; another pattern of the budget runs.
func TestQuarantineAfterOverruns(t *testing.T) {
	_, db := openRules(t, `
budgets:
  - {name: reports, mode: enforce, max_duration: 200ms, quarantine: {after: 2, for: 30s}}
rules:
  - {budget: reports, match: {app: reports}}
`)
	ctx := tagging.With(context.Background(), "app", "reports")
	for range 2 {
		if _, err := db.ExecContext(ctx, "select pg_sleep(5)"); !errors.Is(err, driver.ErrOverrun) {
			t.Fatalf("want an overrun, got %v", err)
		}
	}
	t0 := time.Now()
	_, err := db.ExecContext(ctx, "select pg_sleep(5)")
	be := asBlocked(t, err)
	if be.Reason != driver.ReasonQuarantine || be.Budget != "reports" || be.RetryAfter < 29*time.Second || be.RetryAfter > 30*time.Second {
		t.Fatalf("%+v", be)
	}
	if d := time.Since(t0); d > time.Second { // it would sleep 5 s if sent
		t.Errorf("refused after %v, not at once", d)
	}
	if _, err := db.ExecContext(ctx, "select pg_sleep(0.01)::text || 'other'"); err != nil {
		t.Fatalf("another pattern: %v", err)
	}
}
