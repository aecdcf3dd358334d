package integration

import (
	"context"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// reloadFront is a front end (database/sql or driver.NewPool) on a database of its own, with
// its rules replaced by reload, as an application's reload does (SetConfig).
type reloadFront struct {
	exec   func(ctx context.Context, q string) error
	snap   func() driver.Snapshot
	reload func(rules string) error
	dsn    string
}

// openReloadFronts returns how to open each front end, "sql" and "pool", under rules, with
// room for 40 and 20 connections.
func openReloadFronts(rules string) map[string]func(t *testing.T) reloadFront {
	setConfig := func(set func(*driver.Config) error) func(string) error {
		return func(rules string) error {
			cfg, err := driver.ParseConfig([]byte(rules))
			if err != nil {
				return err
			}
			return set(cfg)
		}
	}
	return map[string]func(t *testing.T) reloadFront{
		"sql": func(t *testing.T) reloadFront {
			dsn := pgtest.Shared(t).CreateDatabase(t)
			c, db := openRulesOn(t, dsn, rules)
			db.SetMaxOpenConns(40)
			return reloadFront{
				exec:   func(ctx context.Context, q string) error { _, err := db.ExecContext(ctx, q); return err },
				snap:   c.Snapshot,
				reload: setConfig(c.SetConfig),
				dsn:    dsn,
			}
		},
		"pool": func(t *testing.T) reloadFront {
			dsn := pgtest.Shared(t).CreateDatabase(t)
			sep := "?"
			if strings.Contains(dsn, "?") {
				sep = "&"
			}
			p := openPoolAt(t, dsn+sep+"pool_max_conns=20", rules)
			return reloadFront{
				exec:   func(ctx context.Context, q string) error { _, err := p.Exec(ctx, q); return err },
				snap:   p.Snapshot,
				reload: setConfig(p.SetConfig),
				dsn:    dsn,
			}
		},
	}
}

// budgetNamed returns the status of the budget name in s.
func budgetNamed(s driver.Snapshot, name string) (driver.BudgetStatus, bool) {
	for _, b := range s.Budgets {
		if b.Name == name {
			return b, true
		}
	}
	return driver.BudgetStatus{}, false
}
