package integration

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
)

// Helpers of the tests of a failing database: a front end (driver.NewPool or database/sql) opened on a
// DSN under rules given inline, and a check that nothing is left in flight or waiting.

type dbfailFront struct {
	exec func(ctx context.Context, q string, args ...any) error
	snap func() driver.Snapshot
}

func openDbfailFront(t *testing.T, front, dsn, rules string) dbfailFront {
	t.Helper()
	bg := context.Background()
	cfg, err := driver.ParseConfig([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	if front == "pool" {
		pc, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		pc.MaxConns = 4
		p, err := driver.NewPoolFromConfig(bg, pc, driver.WithConfig(cfg))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return dbfailFront{
			exec: func(ctx context.Context, q string, args ...any) error { _, err := p.Exec(ctx, q, args...); return err },
			snap: p.Snapshot,
		}
	}
	cn, err := driver.NewConnector(dsn, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(cn)
	t.Cleanup(func() { db.Close() })
	return dbfailFront{
		exec: func(ctx context.Context, q string, args ...any) error {
			_, err := db.ExecContext(ctx, q, args...)
			return err
		},
		snap: cn.Snapshot,
	}
}

// checkDbfailIdle fails t unless the front end's Snapshot shows nothing in flight and
// nothing waiting once the load is over.
func checkDbfailIdle(t *testing.T, what string, snap func() driver.Snapshot) {
	t.Helper()
	ok := eventually(20*time.Second, func() bool {
		s := snap()
		if s.InFlight != 0 {
			return false
		}
		for _, b := range s.Budgets {
			if b.InFlight != 0 || b.Waiting != 0 {
				return false
			}
		}
		return true
	})
	if !ok {
		s := snap()
		var bs []string
		for _, b := range s.Budgets {
			bs = append(bs, fmt.Sprintf("%s in_flight %d waiting %d", b.Name, b.InFlight, b.Waiting))
		}
		t.Fatalf("%s: after the load, Snapshot InFlight %d, budgets %v; want all 0", what, s.InFlight, bs)
	}
}
