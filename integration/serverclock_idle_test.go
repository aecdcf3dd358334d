package integration

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// A primary-key lookup whose rows the application works on for 100 ms costs the server a few
// microseconds: on the server's clock it fits a per_query_limit of 20ms, on the client's it
// does not. What keeps it on the server's clock is the server's report of it, which neither
// an idle spell nor a reload of health_interval takes away.

const heldLookup = "select v from held_items where id = $1"

// openHeldLookup opens a connector at health_interval interval on a database with
// pg_stat_statements and the lookup's table, under a per_query_limit of 20ms, and runs the
// lookup until the server's clock prices it.
func openHeldLookup(t *testing.T, interval string) (*driver.Connector, *sql.DB, func(hold time.Duration) error) {
	t.Helper()
	srv := pgtest.Shared(t)
	dsn := srv.CreateDatabase(t)
	srv.EnableStatStatements(t, dsn)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `create table held_items (id int primary key, v int);
		insert into held_items select g, g from generate_series(1, 1000) g; analyze held_items`); err != nil {
		t.Fatal(err)
	}
	c, db := openRulesOn(t, dsn, lookupRules(interval))
	// run runs the lookup, holding its row for hold (the application's work on it).
	run := func(hold time.Duration) error {
		rows, err := db.QueryContext(ctx, heldLookup, 7)
		if err != nil {
			return err
		}
		for rows.Next() {
			time.Sleep(hold)
		}
		return errors.Join(rows.Err(), rows.Close())
	}
	waitFor(t, 20*time.Second, "the lookup on the server's clock", func() (bool, string) {
		if err := run(time.Millisecond); err != nil && !errors.Is(err, driver.ErrBlocked) {
			t.Fatal(err)
		}
		ps, ok := patternClock(c.Snapshot(), "held_items")
		return ok && ps.Clock == driver.ClockServer, ps.Clock
	})
	return c, db, run
}

func lookupRules(interval string) string {
	return `
health_interval: ` + interval + `
budgets:
  - {name: lookups, mode: enforce, per_query_limit: 20ms}
rules:
  - {budget: lookups, match: {table: held_items}}
`
}

// lookupsFor runs the lookup every 50 ms for d, its row held 100 ms, and counts the refusals.
func lookupsFor(t *testing.T, d time.Duration, run func(time.Duration) error) (ran, refused int) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		switch err := run(100 * time.Millisecond); {
		case errors.Is(err, driver.ErrBlocked):
			refused++
		case err != nil:
			t.Fatal(err)
		default:
			ran++
		}
	}
	return ran, refused
}

// TestServerClockKeepsAnIdlePattern: after 40 health intervals idle, the lookup is still
// priced on the server's clock and admitted. It lapsed to the client's clock (the rows'
// 100 ms), was refused as never fitting, and each report of the server admitted one lookup,
// whose execution wiped the report.
func TestServerClockKeepsAnIdlePattern(t *testing.T) {
	c, _, run := openHeldLookup(t, "50ms")
	if ran, refused := lookupsFor(t, 2*time.Second, run); refused > 0 {
		t.Fatalf("active: %d of %d refused", refused, ran+refused)
	}
	time.Sleep(2 * time.Second)
	ran, refused := lookupsFor(t, 5*time.Second, run)
	ps, _ := patternClock(c.Snapshot(), "held_items")
	if refused > 0 || ps.Clock != driver.ClockServer {
		t.Errorf("after 2s idle: %d of %d lookups refused; the pattern on the %s clock, mean %.4fs", refused, ran+refused,
			ps.Clock, ps.MeanCost)
	}
}

// TestServerClockKeepsPatternsWhenTheIntervalRises: a reload that raises health_interval from
// 100ms to 2s, traffic unchanged, refuses nothing. The new reader started afresh, and the
// patterns' reports lapsed before its second read.
func TestServerClockKeepsPatternsWhenTheIntervalRises(t *testing.T) {
	c, _, run := openHeldLookup(t, "100ms")
	if ran, refused := lookupsFor(t, 2*time.Second, run); refused > 0 {
		t.Fatalf("before the reload: %d of %d refused", refused, ran+refused)
	}
	cfg, err := driver.ParseConfig([]byte(lookupRules("2s")))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	ran, refused := lookupsFor(t, 6*time.Second, run)
	ps, _ := patternClock(c.Snapshot(), "held_items")
	if refused > 0 {
		t.Errorf("after health_interval 100ms → 2s: %d of %d lookups refused; the pattern on the %s clock", refused,
			ran+refused, ps.Clock)
	}
}
