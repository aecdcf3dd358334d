package integration

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// queueFront is a front end with its Wait.
type queueFront struct {
	name   string
	exec   func(ctx context.Context, q string) error
	hold   func(ctx context.Context, q string) (release func(), err error)
	wait   func(ctx context.Context) error
	budget func(name string) driver.BudgetStatus
}

// queueFronts opens a *driver.Pool and a *sql.DB (through a Connector) of maxConns
// connections each on one fresh database, under rules.
func queueFronts(t *testing.T, rules string, maxConns int) []queueFront {
	t.Helper()
	dsn := pgtest.Shared(t).CreateDatabase(t)
	cfg, err := driver.ParseConfig([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = int32(maxConns)
	p, err := driver.NewPoolFromConfig(context.Background(), pc, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	c, err := driver.NewConnector(dsn, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	t.Cleanup(func() { db.Close() })
	return []queueFront{
		{name: "NewPool",
			exec: func(ctx context.Context, q string) error { _, err := p.Exec(ctx, q); return err },
			hold: func(ctx context.Context, q string) (func(), error) {
				rows, err := p.Query(ctx, q)
				return rows.Close, err
			},
			wait:   p.Wait,
			budget: func(name string) driver.BudgetStatus { return poolBudget(t, p, name) }},
		{name: "Open",
			exec: func(ctx context.Context, q string) error { _, err := db.ExecContext(ctx, q); return err },
			hold: func(ctx context.Context, q string) (func(), error) {
				rows, err := db.QueryContext(ctx, q)
				if err != nil {
					return nil, err
				}
				return func() { rows.Close() }, nil
			},
			wait:   c.Wait,
			budget: func(name string) driver.BudgetStatus { return budgetStatus(t, c, name) }},
	}
}
