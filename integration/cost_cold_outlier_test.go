package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestColdPatternNotRefusedOnGuess: a pattern with no history is priced by the global k, and
// its guess is judged against per_query_limit; one slow early statement must not make that
// guess refuse what fits. Here the process's first large statement (an UPDATE that scans a
// 200,000-row table and changes its last ten rows) waits 2 s on a row lock another session
// holds on one of them: nearly all of its time is the wait, however loaded the machine. The
// next new pattern, a COUNT over the same table that runs in milliseconds, must not be priced
// at about 2 s by a global k that this one lock wait taught alone, and refused before it ever
// ran.
func TestColdPatternNotRefusedOnGuess(t *testing.T) {
	c, db := openRules(t, `
budgets:
  - {name: api, mode: enforce, per_query_limit: 500ms}
rules:
  - {budget: api, match: {app: api}}
`)
	ctx := context.Background()
	api := tagging.With(ctx, "app", "api")
	mustExec(t, db, ctx, "create table big (id int primary key, v int not null)")
	mustExec(t, db, ctx, "insert into big select g, g from generate_series(1, 200000) g")
	mustExec(t, db, ctx, "analyze big")

	var dbname string
	if err := db.QueryRowContext(ctx, "select current_database()").Scan(&dbname); err != nil {
		t.Fatal(err)
	}
	dsn := pgtest.Shared(t).DSN
	lockerCfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	lockerCfg.Database = dbname
	locker, err := pgx.ConnectConfig(ctx, lockerCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(ctx)
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "select * from big where id = 200000 for update"); err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	time.AfterFunc(2*time.Second, func() { committed <- tx.Commit(context.Background()) })

	// The process's first large statement waits for the row lock: 2 s, nearly all of it waiting.
	start := time.Now()
	if _, err := db.ExecContext(api, "update big set v = v + 1 where v > $1", 199990); err != nil {
		t.Fatalf("the update: %v", err)
	}
	t.Logf("the update took %v (waiting on the row lock)", time.Since(start).Round(time.Millisecond))
	if err := <-committed; err != nil { // and locker is free again
		t.Fatal(err)
	}

	// What the new pattern really costs, measured outside pgtraffic.
	start = time.Now()
	var n int
	if err := locker.QueryRow(ctx, "select count(*) from big where v >= $1", 0).Scan(&n); err != nil {
		t.Fatal(err)
	}
	real := time.Since(start)

	_, err = db.ExecContext(api, "select count(*) from big where v >= $1", 0)
	var be *driver.BlockedError
	if errors.As(err, &be) {
		t.Errorf("a new pattern that takes %v (per_query_limit 500ms) was refused before it ever ran: %v; "+
			"its cost is unknown (a guess from a global k seeded by one lock wait), which must never "+
			"by itself refuse a statement that fits", real.Round(time.Millisecond), be)
	} else if err != nil {
		t.Fatal(err)
	}
	for _, p := range c.Snapshot().Patterns {
		t.Logf("pattern %q plan=%.0f mean=%.3gs", p.Query, p.PlanCost, p.MeanCost)
	}
}
