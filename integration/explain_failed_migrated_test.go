package integration

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestMissingTableThenMigratedIsPriced: a deploy whose code reaches the server before its
// migration. The quick start's per_query_limit: "refuse a report predicted to take longer than
// 2 s"; the README's cold start: "a guess above per_query_limit is still refused before it
// runs"; its cost step: "A failed EXPLAIN falls back to history". A report over tables that do
// not exist yet fails, as it must (SQLSTATE 42P01, its EXPLAIN failing first). The migration
// then creates the tables (200,000 rows each), and the same report, a cross join that the
// planner prices at hours, is refused before it runs, as a new pattern of the same cross join
// (the tables named in the other order) is: the EXPLAIN failure of the missing table, which
// the statement shared, is not remembered for the plan's TTL, which would leave the pattern,
// with no history, admitted as of unknown cost for up to a minute.
func TestMissingTableThenMigratedIsPriced(t *testing.T) {
	for _, front := range []string{"Open", "NewPool"} {
		t.Run(front, func(t *testing.T) { missingTableThenMigrated(t, front) })
	}
}

func missingTableThenMigrated(t *testing.T, front string) {
	ctx := context.Background()
	dsn := pgtest.Shared(t).CreateDatabase(t)
	raw := openRaw(t, dsn)
	rules := `
budgets:
  - {name: reports, mode: enforce, per_query_limit: 2s}
rules:
  - {budget: reports, match: {app: reports}}
`
	var exec func(ctx context.Context, q string) error
	switch front {
	case "Open":
		cfg, err := driver.ParseConfig([]byte(rules))
		if err != nil {
			t.Fatal(err)
		}
		c, err := driver.NewConnector(dsn, driver.WithConfig(cfg), driver.WithLogger((&lockedBuffer{}).logger()))
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(c)
		t.Cleanup(func() { db.Close() })
		exec = func(ctx context.Context, q string) error { _, err := db.ExecContext(ctx, q); return err }
	case "NewPool":
		p := openPoolAt(t, dsn, rules, driver.WithLogger((&lockedBuffer{}).logger()))
		exec = func(ctx context.Context, q string) error { _, err := p.Exec(ctx, q); return err }
	}
	rep := tagging.With(ctx, "app", "reports")
	const report = `select count(*) from late_a a cross join late_b b where a.v < b.v`
	if err := exec(rep, report); err == nil || !contains(err.Error(), "42P01") {
		t.Fatalf("before the migration: %v, want the server's 42P01", err)
	}
	for _, s := range []string{
		`create table late_a (id int not null, v text not null)`,
		`create table late_b (id int not null, v text not null)`,
		`insert into late_a select g, md5(g::text) from generate_series(1, 200000) g`,
		`insert into late_b select id, v from late_a`,
		`analyze late_a, late_b`,
	} {
		mustExec(t, raw, ctx, s)
	}
	// The same cross join as a pattern never seen: refused before it runs.
	fresh, cancel := context.WithTimeout(rep, 3*time.Second)
	defer cancel()
	var be *driver.BlockedError
	if err := exec(fresh, `select count(*) from late_b b cross join late_a a where a.v < b.v`); !errors.As(err, &be) || be.Reason != driver.ReasonPerQuery {
		t.Fatalf("the cross join as a new pattern: %v, want refused by per_query_limit", err)
	}
	again, cancel2 := context.WithTimeout(rep, 3*time.Second)
	defer cancel2()
	t0 := time.Now()
	err := exec(again, report)
	if !errors.As(err, &be) {
		t.Errorf("the report, its tables now migrated, seconds after its EXPLAIN failed on the missing table: %v after %v "+
			"(sent and cut off by the test's 3s deadline), want refused by per_query_limit: 2s as the same cross join is as a new pattern",
			err, time.Since(t0).Round(time.Millisecond))
	}
}
