package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestReloadLoweredMaxQueueShedsWaiters: under database/sql a waiting statement holds
// its connection, and the README's sizing rule is that one budget's statements hold at most
// max_concurrent + max_queue connections; it also says new rules reach the statements already
// waiting under max_wait at once, each decided again under them. An operator who sees the
// waiters of a budget holding the application's pool lowers max_queue from 4 to 1: from then
// on at most one statement may wait, and the others must be refused (reason concurrency, with
// a RetryAfter), giving their connections back.
//
// Today a waiter decided again rejoins in its place of arrival without the bound being
// checked, so all four keep waiting (and holding four connections) until a slot frees or
// their max_wait ends.
func TestReloadLoweredMaxQueueShedsWaiters(t *testing.T) {
	cfg := func(maxQueue int) *driver.Config {
		return &driver.Config{
			Budgets: []driver.Budget{{Name: "b", Mode: driver.ModeEnforce, MaxConcurrent: new(1),
				MaxWait: driver.Duration(60 * time.Second), MaxQueue: new(maxQueue)}},
			Rules: []driver.Rule{{Budget: "b", Match: map[string]string{"app": "x"}}},
		}
	}
	c, db := openRules(t, "{}")
	if err := c.SetConfig(cfg(4)); err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(10)
	ctx := tagging.With(context.Background(), "app", "x")
	rows, err := db.QueryContext(ctx, "select 1") // holds the only slot until closed
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 4)
	for range 4 {
		go func() { _, err := db.ExecContext(ctx, "select 2"); done <- err }()
	}
	if !eventually(10*time.Second, func() bool { return budgetStatus(t, c, "b").Waiting == 4 }) {
		t.Fatalf("%d waiting; want 4", budgetStatus(t, c, "b").Waiting)
	}
	if err := c.SetConfig(cfg(1)); err != nil {
		t.Fatal(err)
	}
	refused := 0
	timeout := time.After(20 * time.Second)
	for refused < 3 {
		select {
		case err := <-done:
			var be *driver.BlockedError
			if !errors.As(err, &be) {
				t.Fatalf("a waiter ended with %v while the slot is still held", err)
			}
			refused++
		case <-timeout:
			t.Fatalf("20s after max_queue was lowered to 1, %d statements still wait (%d refused): "+
				"the lowered bound does not reach the statements already waiting",
				budgetStatus(t, c, "b").Waiting, refused)
		}
	}
	if w := budgetStatus(t, c, "b").Waiting; w != 1 {
		t.Errorf("%d waiting after max_queue was lowered to 1", w)
	}
	rows.Close()
	if err := <-done; err != nil {
		t.Errorf("the one waiter left: %v", err)
	}
}
