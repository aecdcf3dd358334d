package integration

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestHealthDisconnectedStandbyIsNotCaughtUp: a connector on a read replica throttles a batch
// budget on `replication_lag: 1`. The standby loses its replication connection (here its
// primary_conninfo points nowhere, as a network partition or a broken replication slot does)
// while the primary keeps committing. The standby has replayed all it received, yet its data is
// seconds (and growing) behind: the budget that exists to keep the batch off a lagging replica
// must not admit it. The lag is 0 only when caught up; a standby that receives nothing
// cannot know it is, and reads as lagging (the age of its last replayed transaction) or as
// unknown (stale), never as 0.
func TestHealthDisconnectedStandbyIsNotCaughtUp(t *testing.T) {
	primary := privateServer(t)
	standby, err := primary.StartStandby()
	if err != nil {
		t.Fatalf("StartStandby: %v", err)
	}
	t.Cleanup(func() { standby.Stop() })
	ctx := context.Background()
	pconn, err := pgx.Connect(ctx, primary.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pconn.Close(ctx)
	if _, err := pconn.Exec(ctx, "create table lag_probe (id bigserial primary key)"); err != nil {
		t.Fatal(err)
	}
	sconn, err := pgx.Connect(ctx, standby.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer sconn.Close(ctx)
	waitFor(t, healthSettle, "the standby replays the table", func() (bool, string) {
		var ok bool
		err := sconn.QueryRow(ctx, "select to_regclass('lag_probe') is not null").Scan(&ok)
		return err == nil && ok, fmt.Sprint(ok, err)
	})

	cfg, err := driver.ParseConfig([]byte(`
health_interval: 200ms
budgets:
  - {name: batch, mode: enforce, throttle_when: {replication_lag: 1}}
rules:
  - {budget: batch, match: {job: import}}
`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := driver.NewConnector(standby.DSN, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { db.Close() })
	batch := tagging.With(ctx, "job", "import")
	waitFor(t, healthSettle, "the caught-up standby admits the batch", func() (bool, string) {
		err := c.Check(batch)
		return err == nil, fmt.Sprint(err)
	})

	primaryRows, standbyRows, age := cutReplication(t, pconn, sconn)
	time.Sleep(600 * time.Millisecond) // a few health intervals
	if err := c.Check(batch); err == nil {
		t.Errorf("Check on a standby cut off from its primary for 3 s (%d of %d rows, last replay %.1fs ago) = nil; "+
			"want a health denial (replication_lag exceeded, or its sample stale)", standbyRows, primaryRows, age)
	}
}

// cutReplication cuts the standby sconn off from its primary pconn (its walreceiver reconnects
// to a port nobody listens on), has the primary commit for 3 s into lag_probe, none of which
// reaches the standby, and returns the rows each has and how old the standby's last replayed
// commit is.
func cutReplication(t *testing.T, pconn, sconn *pgx.Conn) (primaryRows, standbyRows int, age float64) {
	t.Helper()
	ctx := context.Background()
	for _, q := range []string{
		"alter system set primary_conninfo = 'host=127.0.0.1 port=1 user=postgres connect_timeout=1'",
		"select pg_reload_conf()",
	} {
		if _, err := sconn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	waitFor(t, healthSettle, "the standby stops streaming", func() (bool, string) {
		var n int
		err := sconn.QueryRow(ctx, "select count(*) from pg_stat_wal_receiver where status = 'streaming'").Scan(&n)
		return err == nil && n == 0, fmt.Sprint(n, err)
	})
	// The primary commits for 3 s; none of it reaches the standby.
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, err := pconn.Exec(ctx, "insert into lag_probe default values"); err != nil {
			t.Fatal(err)
		}
	}
	if err := pconn.QueryRow(ctx, "select count(*) from lag_probe").Scan(&primaryRows); err != nil {
		t.Fatal(err)
	}
	if err := sconn.QueryRow(ctx, "select count(*), coalesce(extract(epoch from now() - pg_last_xact_replay_timestamp()), -1)::float8 from lag_probe").
		Scan(&standbyRows, &age); err != nil {
		t.Fatal(err)
	}
	t.Logf("primary has %d rows, the standby %d; the standby's last replayed commit is %.1fs old", primaryRows, standbyRows, age)
	if standbyRows >= primaryRows {
		t.Fatalf("the standby kept up (%d >= %d rows): replication was not cut", standbyRows, primaryRows)
	}
	return primaryRows, standbyRows, age
}
