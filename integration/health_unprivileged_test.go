package integration

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestHealthActiveQueriesUnprivilegedRoleFailsSafe: the application connects as an ordinary
// role (no pg_monitor, no pg_read_all_stats), as most applications do, and throttles its batch
// budget on `active_queries: 4`. Eight queries of another role (a reporting tool, a cron job)
// are active on the server. design.md defines the metric as the backends in state active in
// pg_stat_activity; PostgreSQL hides the state of other roles' backends from this role, so the
// sampler cannot know it. For replication_lag the README says exactly what happens when the
// role cannot see what the metric needs: "without it the metric's read fails and turns stale",
// which an enforce budget counts as exceeded (fail safe), never as a 0 "that would say all is
// well". active_queries must not do the opposite: were it to count only the backends the role
// can see (here 0), the batch would be admitted while the server runs twice its threshold. Its
// read fails instead, naming the grant, and the sample turns stale. The other role's idle
// session (admin's pooled connection) makes nothing fail: the idle server admits at first.
func TestHealthActiveQueriesUnprivilegedRoleFailsSafe(t *testing.T) {
	srv := pgtest.Shared(t)
	dsn := srv.CreateDatabase(t)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	role := fmt.Sprintf("review_unpriv_%d", time.Now().UnixNano())
	if _, err := admin.Exec("create role " + role + " login"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec("drop role " + role) })
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)

	cfg, err := driver.ParseConfig([]byte(`
health_interval: 200ms
budgets:
  - {name: batch, mode: enforce, throttle_when: {active_queries: 4}}
rules:
  - {budget: batch, match: {job: import}}
`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := driver.NewConnector(u.String(), driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	batch := tagging.With(ctx, "job", "import")
	waitFor(t, healthSettle, "the idle server admits the batch", func() (bool, string) {
		err := c.Check(batch)
		return err == nil, fmt.Sprint(err)
	})

	// Eight active queries of the superuser, a role the application's role cannot see into.
	startLoad(t, srv.DSN, 8)
	waitFor(t, healthSettle, "Check stops admitting the batch (over the threshold, or unknown: stale)", func() (bool, string) {
		return healthBlocked(c.Check(batch), "batch", "active_queries")
	})
}
