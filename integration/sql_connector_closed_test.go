package integration

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	pgtdriver "github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// A *Connector is what sql.OpenDB takes, and (*sql.DB).Close closes it: its rules watcher and
// health sampler stop. Handed to sql.OpenDB again (a reconnect after a config change, or two
// *sql.DB sharing one connector's budgets, one of them closed), it still opens connections, but
// with a frozen rules file and no health samples: every statement of a throttle_when budget is
// refused as "sample is stale" with a 100ms RetryAfter that will never come true, and edits of
// the rules file are ignored. A closed connector must say so (ErrClosed), not half-work.
func TestConnectorUsedAfterClose(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(`
health_interval: 100ms
budgets:
  - {name: h, mode: enforce, throttle_when: {active_queries: 1000}}
rules:
  - {budget: h, match: {app: h}}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := pgtdriver.NewConnector(dsn, pgtdriver.WithRulesFile(path))
	if err != nil {
		t.Fatal(err)
	}
	ctx := tagging.With(context.Background(), "app", "h")
	db1 := sql.OpenDB(c)
	if !eventually(5*time.Second, func() bool { _, err := db1.ExecContext(ctx, "select 1"); return err == nil }) {
		t.Fatal("the health budget never admitted a statement")
	}
	db1.Close() // closes c

	db2 := sql.OpenDB(c)
	defer db2.Close()
	time.Sleep(time.Second) // 10 health intervals: the last sample is stale by now
	_, err = db2.ExecContext(ctx, "select 1")
	if errors.Is(err, pgtdriver.ErrClosed) {
		return
	}
	var be *pgtdriver.BlockedError
	if errors.As(err, &be) {
		t.Fatalf("a statement through a closed connector: %v (want ErrClosed: the connector's health sampler is stopped, so this refusal lasts for ever)", err)
	}
	t.Fatalf("a statement through a closed connector: %v, want ErrClosed", err)
}
