package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// TestTimeoutDuringExplainIsPgxs: a statement whose context deadline passes while it
// waits for a lock (a migration holds the table) fails, on pgxpool, with pgx's timeout error:
// errors.Is(err, context.DeadlineExceeded) and pgconn.Timeout(err), pgx's documented test for
// "caused by a timeout". Under a budget that admits everything but prices statements
// (server_share / per_query_limit), the statement's EXPLAIN is what waits for the lock, and the
// statement's error must be pgx's all the same, or code that classifies pgx errors with
// pgconn.Timeout (retry, 504 mapping) no longer sees a timeout. On the pool, a PoolConn and in a
// transaction alike; the same with the default explain mode (a pattern's first statement).
func TestTimeoutDuringExplainIsPgxs(t *testing.T) {
	srv := pgtest.Shared(t)
	ctx := context.Background()
	type db interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
		QueryRow(context.Context, string, ...any) pgx.Row
		Begin(context.Context) (pgx.Tx, error)
	}
	run := func(d db, dsn string) []string {
		if _, err := d.Exec(ctx, "create table items (id int primary key)"); err != nil {
			t.Fatal(err)
		}
		lk := lockTable(t, dsn, "items")
		defer lk.Rollback(ctx)
		var out []string
		try := func(what string, f func(c context.Context) error) {
			c, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			err := f(c)
			out = append(out, fmt.Sprintf("%s: Is(DeadlineExceeded)=%v pgconn.Timeout=%v (%T %v)",
				what, errors.Is(err, context.DeadlineExceeded), pgconn.Timeout(err), err, err))
		}
		try("pool Exec", func(c context.Context) error {
			_, err := d.Exec(c, "select count(*) from items where id > $1", 1)
			return err
		})
		try("pool QueryRow", func(c context.Context) error {
			return d.QueryRow(c, "select id from items where id = $1", 2).Scan(new(int))
		})
		try("tx Exec", func(c context.Context) error {
			tx, err := d.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			_, err = tx.Exec(c, "select count(*) from items where id < $1", 3)
			return err
		})
		return out
	}
	dsn := srv.CreateDatabase(t)
	raw, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	want := run(raw, dsn)

	for _, rules := range []string{parityAdmitAll, `budgets:
  - {name: all, mode: enforce, max_concurrent: 1000, server_share: 1, burst_limit: 1h}
rules:
  - {budget: all, match: {username: postgres}}
`} {
		dsn := srv.CreateDatabase(t)
		cfg, err := driver.ParseConfig([]byte(rules))
		if err != nil {
			t.Fatal(err)
		}
		p, err := driver.NewPool(ctx, dsn, driver.WithConfig(cfg))
		if err != nil {
			t.Fatal(err)
		}
		got := run(p, dsn)
		p.Close()
		for i := range want {
			wantShort, gotShort := want[i][:len("pool QueryRow: Is(DeadlineExceeded)=true pgconn.Timeout=true")], got[i]
			if len(gotShort) > len(wantShort) {
				gotShort = gotShort[:len(wantShort)]
			}
			if wantShort != gotShort {
				t.Errorf("budget admitting everything:\n  pgxpool:   %s\n  pgtraffic: %s", want[i], got[i])
			}
		}
	}
}
