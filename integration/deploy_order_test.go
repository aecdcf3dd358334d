package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestDeployReloadKeepsArrivalOrder: the README promises that waiting statements "are
// admitted in arrival order". Six statements queue, one after the other, for the single slot
// held by open rows. A reload that changes nothing about their budget (another budget is added,
// as a deploy adds one) comes while they wait; then the slot is freed. They must still be
// admitted in the order they arrived.
func TestDeployReloadKeepsArrivalOrder(t *testing.T) {
	t.Run("one reload", func(t *testing.T) { reloadArrivalOrder(t, 1) })
	t.Run("twenty reloads", func(t *testing.T) { reloadArrivalOrder(t, 20) })
}

func reloadArrivalOrder(t *testing.T, reloads int) {
	before := "budgets:\n  - {name: q, mode: enforce, max_concurrent: 1, max_wait: 20s, max_queue: 8}\nrules:\n  - {budget: q, match: {app: o}}\n"
	after := "budgets:\n  - {name: q, mode: enforce, max_concurrent: 1, max_wait: 20s, max_queue: 8}\n  - {name: other, mode: enforce, max_concurrent: 5}\nrules:\n  - {budget: q, match: {app: o}}\n  - {budget: other, match: {app: unrelated}}\n"
	c, db := openRules(t, before)
	db.SetMaxOpenConns(10)
	// The server numbers the statements in the order they run (one at a time: one slot).
	if _, err := db.Exec("create table order_arrivals (seq serial primary key, i int)"); err != nil {
		t.Fatal(err)
	}
	ctx := tagging.With(context.Background(), "app", "o")
	rows, err := db.QueryContext(ctx, "select g from generate_series(1, 100000) g")
	if err != nil {
		t.Fatal(err)
	}
	rows.Next()
	const n = 6
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if _, err := db.ExecContext(ctx, "insert into order_arrivals (i) select $1::int from pg_sleep(0.03)", i); err != nil {
				t.Errorf("waiter %d: %v", i, err)
			}
		})
		if !eventually(3*time.Second, func() bool { b, _ := budgetNamed(c.Snapshot(), "q"); return b.Waiting == i+1 }) {
			t.Fatalf("waiter %d did not queue", i)
		}
	}
	for i := range reloads {
		if i%2 == 0 {
			setRulesOn(t, c, after)
		} else {
			setRulesOn(t, c, before)
		}
		time.Sleep(2 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	rows.Close()
	wg.Wait()
	order := make([]int, 0, n)
	got, err := db.Query("select i from order_arrivals order by seq")
	if err != nil {
		t.Fatal(err)
	}
	for got.Next() {
		var i int
		if err := got.Scan(&i); err != nil {
			t.Fatal(err)
		}
		order = append(order, i)
	}
	if err := got.Err(); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprint([]int{0, 1, 2, 3, 4, 5})
	if got := fmt.Sprint(order); got != want {
		t.Errorf("admitted in order %s after an unrelated reload; arrival order was %s", got, want)
	}
}
