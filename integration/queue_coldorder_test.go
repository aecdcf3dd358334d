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

// TestQueueColdWaiterKeepsItsPlaceOnItsConnection: README, "Waiting for capacity": a pool
// statement that must EXPLAIN first waits before its connection in its place of arrival,
// holds no place while it takes the connection and EXPLAINs (statements that need no EXPLAIN
// may run first), and then waits on that connection in its place of arrival, its max_wait
// counted from its arrival; statements on connections keep their arrival order among
// themselves.
//
// On driver.NewPool, under a budget as the rules documentation writes one (a slot, a bucket, a
// health threshold), six inserts of patterns not costed yet wait for the one slot before their
// connections, each queued before the next arrives. The first one's EXPLAIN waits on a table a
// migration holds locked. The slot goes: all six take a connection and EXPLAIN; one of the
// five others runs first (it holds the slot on an advisory lock), and the four left wait on
// their connections. The migration commits: the first waits on its connection too. Once the
// slot goes, the first runs next, and the four others in their order of arrival.
func TestQueueColdWaiterKeepsItsPlaceOnItsConnection(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	cfg, err := driver.ParseConfig([]byte(`
budgets:
  - {name: q, mode: enforce, max_concurrent: 1, server_share: 1, burst_limit: 100s, max_wait: 30s, max_queue: 8, throttle_when: {in_flight: 1000}}
rules:
  - {budget: q, match: {app: q}}
`))
	if err != nil {
		t.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 10
	bg := context.Background()
	p, err := driver.NewPoolFromConfig(bg, pc, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	admin, err := pgx.Connect(bg, dsn) // the migration, and what holds the first to run
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(bg)
	// Each waiter inserts into a table of its own, so that each is a pattern of its own and
	// EXPLAINs on the connection it takes: waiters of one pattern would wait for the first's
	// EXPLAIN, and those that came back after it had cached the plan would wait before a
	// connection instead, as the machine's load decides. A sequence keeps the order they ran in.
	setup := "create sequence cold_seq; create table migrated (id int)"
	for i := range 6 {
		setup += fmt.Sprintf("; create table cold_arrivals_%d (seq bigint, i int)", i)
	}
	if _, err := admin.Exec(bg, setup); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(bg, "select pg_advisory_lock(7)"); err != nil {
		t.Fatal(err)
	}
	tx, err := admin.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(bg)
	if _, err := tx.Exec(bg, "lock table migrated in access exclusive mode"); err != nil {
		t.Fatal(err)
	}

	ctx := tagging.With(bg, "app", "q")
	rows, err := p.Query(ctx, "select 1") // holds the slot
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	errs := make(chan error, 6)
	for i := range 6 {
		// An EXPLAIN runs no function: the advisory lock holds the statement only as it runs.
		q := fmt.Sprintf("insert into cold_arrivals_%d select nextval('cold_seq'), $1::int from pg_advisory_xact_lock_shared(7)", i)
		if i == 0 {
			q = "insert into cold_arrivals_0 select nextval('cold_seq'), $1::int + 0 * count(*) from migrated"
		}
		go func() { _, err := p.Exec(ctx, q, i); errs <- err }()
		waitFor(t, 15*time.Second, fmt.Sprintf("waiter %d queued", i), func() (bool, string) {
			s := poolBudget(t, p, "q")
			return s.Waiting == i+1, fmt.Sprintf("%+v", s)
		})
	}
	rows.Close()
	// Four wait on their connections, beside the first EXPLAINing on its own and the one running.
	waitFor(t, 15*time.Second, "four waiting on their connections", func() (bool, string) {
		n, c := poolBudget(t, p, "q").Waiting, p.Stat().AcquiredConns()
		return n == 4 && c == 6, fmt.Sprintf("%d waiting, %d connections acquired", n, c)
	})
	if err := tx.Commit(bg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "the first waiting on its connection", func() (bool, string) {
		n, c := poolBudget(t, p, "q").Waiting, p.Stat().AcquiredConns()
		return n == 5 && c == 6, fmt.Sprintf("%d waiting, %d connections acquired", n, c)
	})
	if _, err := admin.Exec(bg, "select pg_advisory_unlock(7)"); err != nil {
		t.Fatal(err)
	}
	for range 6 {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(40 * time.Second):
			t.Fatal("a waiter never returned")
		}
	}
	all := "select seq, i from cold_arrivals_0"
	for i := 1; i < 6; i++ {
		all += fmt.Sprintf(" union all select seq, i from cold_arrivals_%d", i)
	}
	got, err := admin.Query(bg, "select i from ("+all+") a order by seq")
	if err != nil {
		t.Fatal(err)
	}
	order, err := pgx.CollectRows(got, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("admitted in order %v", order)
	if len(order) != 6 || order[0] == 0 || order[1] != 0 || !slices.IsSorted(order[1:]) {
		t.Errorf("admitted in order %v, want one of 1-5 first, then 0 and the others in arrival order", order)
	}
}
