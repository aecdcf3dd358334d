package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestQueueHealthWaiterKeepsItsPlaceAfterGivingBackItsConn: a statement on driver.NewPool that
// a health threshold holds back only once it has a pool connection, taken for its pattern's
// first EXPLAIN, gives the connection back and waits for health in the budget's queue holding
// none, in its place of arrival; statements waiting for health are admitted in arrival order.
//
// Report 1 (a pattern not yet costed) arrives while the server is healthy and takes a
// connection for its EXPLAIN, which waits on a migration's lock. custom.gate then crosses its
// threshold. Report 2 (a pattern already costed) arrives after report 1 and waits for health
// holding no connection. The migration commits: report 1 is held back by health on its
// connection, gives it back and waits. Health comes back: with one slot, the reports run one at
// a time, and report 1, which arrived first, should run first.
func TestQueueHealthWaiterKeepsItsPlaceAfterGivingBackItsConn(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	bg := context.Background()
	admin, err := pgx.Connect(bg, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(bg)
	if _, err := admin.Exec(bg, "create table gate (v int); insert into gate values (0); create table orders (id int, total int); create table arrivals (seq serial primary key, i int)"); err != nil {
		t.Fatal(err)
	}
	cfg, err := driver.ParseConfig([]byte(`
health_interval: 100ms
health_queries:
  gate: "select v from gate"
budgets:
  - {name: reports, mode: enforce, max_concurrent: 1, server_share: 0.5, max_wait: 30s, max_queue: 4, throttle_when: {custom.gate: 1}}
rules:
  - {budget: reports, match: {app: reporting}}
`))
	if err != nil {
		t.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 4
	p, err := driver.NewPoolFromConfig(bg, pc, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := tagging.With(bg, "app", "reporting")
	const second = "insert into arrivals (i) select $1::int"
	// Report 2's pattern is costed while the server is healthy.
	waitFor(t, 15*time.Second, "a healthy sample", func() (bool, string) {
		err := p.Check(ctx)
		return err == nil, fmt.Sprint(err)
	})
	if _, err := p.Exec(ctx, second, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(bg, "delete from arrivals"); err != nil {
		t.Fatal(err)
	}

	// A migration locks orders: report 1's EXPLAIN waits on it.
	tx := lockTable(t, dsn, "orders")
	done := make(chan error, 2)
	go func() {
		_, err := p.Exec(ctx, "insert into arrivals (i) select 1 + count(*) from orders")
		done <- err
	}()
	waitFor(t, 15*time.Second, "report 1 explained on its connection", func() (bool, string) {
		n := p.Stat().AcquiredConns()
		return n == 1, fmt.Sprintf("%d acquired", n)
	})
	time.Sleep(100 * time.Millisecond)

	// The server becomes unhealthy; report 2 arrives and waits for health.
	if _, err := admin.Exec(bg, "update gate set v = 5"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "the unhealthy sample", func() (bool, string) {
		err := p.Check(ctx)
		return err != nil, fmt.Sprint(err)
	})
	go func() {
		_, err := p.Exec(ctx, second, 2)
		done <- err
	}()
	waitFor(t, 15*time.Second, "report 2 waiting", func() (bool, string) {
		n := poolBudget(t, p, "reports").Waiting
		return n == 1, fmt.Sprintf("%d waiting", n)
	})

	// The migration commits: report 1 is held back by health on its connection.
	if err := tx.Commit(bg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "both reports waiting for health holding no connection", func() (bool, string) {
		select {
		case err := <-done:
			var got []int32
			rows, _ := admin.Query(bg, "select i from arrivals order by seq")
			got, _ = pgx.CollectRows(rows, pgx.RowTo[int32])
			t.Fatalf("a report returned while the server was unhealthy: %v; rows %v; %+v", err, got, poolBudget(t, p, "reports"))
		default:
		}
		n, c := poolBudget(t, p, "reports").Waiting, p.Stat().AcquiredConns()
		return n == 2 && c == 0, fmt.Sprintf("%d waiting, %d connections acquired", n, c)
	})

	// Health comes back.
	if _, err := admin.Exec(bg, "update gate set v = 0"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("report: %v", err)
			}
		case <-time.After(40 * time.Second):
			t.Fatal("a report never returned")
		}
	}
	rows, err := admin.Query(bg, "select i from arrivals order by seq")
	if err != nil {
		t.Fatal(err)
	}
	order, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("admitted in order %v", order)
	if !slices.Equal(order, []int32{1, 2}) {
		t.Errorf("reports admitted in order %v, want their arrival order [1 2]: report 1 lost its place when it gave back the connection it took for its EXPLAIN", order)
	}
}
