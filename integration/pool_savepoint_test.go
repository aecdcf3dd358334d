package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// TestPoolSavepointInEndedSavepoint: a savepoint inside a savepoint that was rolled back or
// released still sends its statements in the transaction, as pgx's savepoints do (each checks
// its own end and the outermost transaction's): the Pool's refused them with pgx.ErrTxClosed,
// unsent. Both pools run the same steps under an enforce budget that selects every statement,
// and must answer alike.
func TestPoolSavepointInEndedSavepoint(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	ctx := context.Background()
	raw, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Exec(ctx, "create table items (id int primary key)"); err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	p := openSharedPool(t, dsn, `
budgets:
  - {name: all, mode: enforce, max_concurrent: 4, max_wait: 1s, server_share: 1, burst_limit: 10s}
rules:
  - {budget: all, match: {statement: insert}}
  - {budget: all, match: {statement: select}}
`, &logs)
	type beginner interface {
		Begin(context.Context) (pgx.Tx, error)
	}
	steps := func(db beginner, end string) string {
		answer := func(err error) string {
			var pe *pgconn.PgError
			switch {
			case err == nil:
				return "ok"
			case errors.As(err, &pe):
				return pe.Code
			case errors.Is(err, pgx.ErrTxClosed):
				return "tx closed"
			}
			return err.Error()
		}
		tx, err := db.Begin(ctx)
		if err != nil {
			return err.Error()
		}
		defer tx.Rollback(ctx)
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err.Error()
		}
		sp2, err := sp.Begin(ctx)
		if err != nil {
			return err.Error()
		}
		var out []string
		_, err = sp2.Exec(ctx, "insert into items values (1)")
		out = append(out, answer(err))
		if end == "rollback" {
			out = append(out, answer(sp.Rollback(ctx)))
		} else {
			out = append(out, answer(sp.Commit(ctx)))
		}
		_, err = sp2.Exec(ctx, "insert into items values (2)")
		out = append(out, "exec "+answer(err))
		var n int
		err = sp2.QueryRow(ctx, "select count(*) from items").Scan(&n)
		out = append(out, "queryrow "+answer(err), fmt.Sprint(n))
		out = append(out, "commit "+answer(sp2.Commit(ctx)))
		return strings.Join(out, "; ")
	}
	for _, end := range []string{"rollback", "commit"} {
		want, got := steps(raw, end), steps(p, end)
		if got != want {
			t.Errorf("a savepoint inside one that ended (%s): the Pool answered %q, pgxpool %q", end, got, want)
		}
	}
	snap := p.Snapshot()
	if snap.InFlight != 0 {
		t.Errorf("%d statements in flight after the transactions ended", snap.InFlight)
	}
	if b := snap.Budgets[0]; b.Admitted == 0 {
		t.Errorf("the budget decided none of the statements: %+v", b)
	}
}
