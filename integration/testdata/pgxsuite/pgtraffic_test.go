package stdlib_test

// This file is not built with pgtraffic: TestPgxStdlibSuite (integration/pgxsuite_test.go)
// adds it, through go test -overlay, to pgx's own stdlib test package, whose tests it has
// redirected to the functions below.

import (
	"database/sql"
	"fmt"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgtraffic/pgtraffic/driver"
)

// suiteRules puts every statement of the test database (%s: its name, quoted) under one
// enforce budget whose limits the suite never reaches: 64 execution seconds per second, a
// bucket of an hour, 10,000 statements in flight. A statement still takes the budget's whole
// path: fingerprint, EXPLAIN-based cost, admission.
const suiteRules = `
server_cores: 64
budgets:
  - {name: suite, mode: enforce, server_share: 1, burst_limit: 1h, max_concurrent: 10000}
rules:
  - {budget: suite, match: {database: %s}}
`

// pgtrafficOpenDB stands for stdlib.OpenDB: it opens config's database through pgtraffic, with
// opts passed to pgx's connector. At the end of the test it fails the test if the budget warned
// about or refused a statement, and logs how many it admitted and how many EXPLAINs it ran (a
// database may run no statement: a test of Ping); TestPgxStdlibSuite adds these up.
func pgtrafficOpenDB(t testing.TB, config pgx.ConnConfig, opts ...stdlib.OptionOpenDB) *sql.DB {
	t.Helper()
	rules, err := driver.ParseConfig(fmt.Appendf(nil, suiteRules, strconv.Quote(config.Database)))
	if err != nil {
		t.Fatal(err)
	}
	c, err := driver.NewConnectorFromConfig(&config, driver.WithConfig(rules), driver.WithPgxOptions(opts...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s := c.Snapshot()
		if len(s.Budgets) != 1 {
			t.Fatalf("pgtraffic: %d budgets, want 1", len(s.Budgets))
		}
		b := s.Budgets[0]
		if b.Warned != 0 || b.Blocked != 0 {
			t.Errorf("pgtraffic: budget %s warned %d (%v), blocked %d (%v), want none; recent: %+v",
				b.Name, b.Warned, b.WarnedBy, b.Blocked, b.BlockedBy, s.RecentBlocks)
		}
		t.Logf("pgtraffic budget: admitted %d, explained %d", b.Admitted, s.Counters.ExplainCalls)
	})
	return sql.OpenDB(c)
}

// pgtrafficSQLOpen stands for sql.Open("pgx", dsn), dsn being PGX_TEST_DATABASE's.
func pgtrafficSQLOpen(t testing.TB, dsn string) (*sql.DB, error) {
	t.Helper()
	config, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	return pgtrafficOpenDB(t, *config), nil
}
