package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestHealthSlowReadsNeverStaleAHealthyMetric: the sampler runs the health queries once per
// interval, and when a read fails (a lost connection, a timeout) the last good sample stands
// until it is three intervals old, and the metric is stale from then on. Here a service has six
// custom health queries counting a jobs table (its etl budget), and a web budget throttled on
// another metric, custom.fast, a query that reads a one-row table at once and stays far below
// its threshold. A migration takes an ACCESS EXCLUSIVE lock on jobs: the six jobs queries time
// out each round, and etl is rightly held back as stale. But custom.fast is read in every round
// and the server is healthy for it: the web budget, which reads nothing but custom.fast, must
// never be refused for a stale custom.fast while the other reads take their timeouts.
func TestHealthSlowReadsNeverStaleAHealthyMetric(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	bg := context.Background()
	admin, err := pgx.Connect(bg, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(bg)
	if _, err := admin.Exec(bg, "create table gate(v int); insert into gate values (0); create table jobs(id int, state text)"); err != nil {
		t.Fatal(err)
	}
	const interval = 600 * time.Millisecond
	var queries, thresholds []string
	for i := range 6 {
		queries = append(queries, fmt.Sprintf(`jobs_%d: "select count(*) from jobs where state = 's%d'"`, i, i))
		thresholds = append(thresholds, fmt.Sprintf("custom.jobs_%d: 1000", i))
	}
	rules := fmt.Sprintf(`
health_interval: %s
health_queries: {fast: "select v from gate", %s}
budgets:
  - {name: web, mode: enforce, throttle_when: {custom.fast: 5}}
  - {name: etl, mode: enforce, throttle_when: {%s}}
rules:
  - {budget: web, match: {app: web}}
  - {budget: etl, match: {app: etl}}
`, interval, strings.Join(queries, ", "), strings.Join(thresholds, ", "))
	cfg, err := driver.ParseConfig([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	c, err := driver.NewConnector(dsn, driver.WithConfig(cfg), driver.WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	defer db.Close()
	web := tagging.With(bg, "app", "web")
	waitFor(t, healthSettle, "web admits on a fresh sample", func() (bool, string) {
		_, err := db.ExecContext(web, "select 1")
		return err == nil, fmt.Sprint(err)
	})
	time.Sleep(2 * interval)

	// The migration's lock: each jobs query now waits until the sampler's timeout.
	tx := lockTable(t, dsn, "jobs")
	defer tx.Rollback(bg)
	time.Sleep(interval)

	var checks, refused int
	var first error
	end := time.Now().Add(15 * interval)
	for time.Now().Before(end) {
		checks++
		if err := c.Check(web); err != nil {
			var be *driver.BlockedError
			if !errors.As(err, &be) {
				t.Fatal(err)
			}
			refused++
			if first == nil {
				first = err
			}
		}
		time.Sleep(interval / 10)
	}
	var v int
	if err := admin.QueryRow(bg, "select v from gate").Scan(&v); err != nil {
		t.Fatal(err)
	}
	t.Logf("custom.fast reads %d (threshold 5); web refused %d of %d checks over 15 intervals while jobs was locked; first: %v",
		v, refused, checks, first)
	if refused > 0 {
		t.Errorf("the web budget, whose only metric (custom.fast) is healthy and read without delay, "+
			"was refused %d of %d checks (%v)", refused, checks, first)
	}
}
