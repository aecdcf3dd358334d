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

// TestReloadDroppingPerKeepsInFlight: the README says a budget's in-flight counts
// survive a reload for budgets that keep their name. A budget with per: tenant and
// max_concurrent: 1 runs one statement for each of two tenants; a reload keeps the budget's name
// and max_concurrent: 1 but drops per (one limit for the whole budget again). With two of its
// statements still in flight, a third must be refused (reason concurrency): the status itself
// says 2 in flight against a max_concurrent of 1. Today the third is admitted, because the
// statements in flight hold their slots under the keys "t1" and "t2" and the budget without
// per counts only the key "", which has none: 3 statements of a max_concurrent: 1 budget run
// at once until the old ones end.
func TestReloadDroppingPerKeepsInFlight(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	cfg := func(per string) *driver.Config {
		return &driver.Config{
			Budgets: []driver.Budget{{Name: "b", Mode: driver.ModeEnforce, MaxConcurrent: new(1), Per: per}},
			Rules:   []driver.Rule{{Budget: "b", Match: map[string]string{"app": "x"}}},
		}
	}
	c, err := driver.NewConnector(dsn, driver.WithConfig(cfg("tenant")))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	defer db.Close()
	done := make(chan error, 2)
	for _, tenant := range []string{"t1", "t2"} {
		ctx := tagging.With(context.Background(), "app", "x", "tenant", tenant)
		go func() { _, err := db.ExecContext(ctx, "select pg_sleep(3)"); done <- err }()
	}
	running := func() int {
		for _, b := range c.Snapshot().Budgets {
			if b.Name == "b" {
				return b.InFlight
			}
		}
		return -1
	}
	if !eventually(5*time.Second, func() bool { return running() == 2 }) {
		t.Fatalf("the two tenants' statements are not both in flight: %d", running())
	}
	if err := c.SetConfig(cfg("")); err != nil {
		t.Fatal(err)
	}
	inFlight := running()
	ctx := tagging.With(context.Background(), "app", "x")
	_, err = db.ExecContext(ctx, "select 1")
	var be *driver.BlockedError
	if !errors.As(err, &be) || be.Reason != driver.ReasonConcurrency {
		t.Errorf("after per was dropped, with %d of the budget's statements in flight against max_concurrent 1: "+
			"a third statement got %v; want refused, reason concurrency", inFlight, err)
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
