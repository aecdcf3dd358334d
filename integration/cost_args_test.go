package integration

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// openBudgeted opens pgtraffic on a fresh database with every statement under budget spec.
func openBudgeted(t *testing.T, spec string, setup ...string) (*sql.DB, *sql.DB) {
	t.Helper()
	dsn := pgtest.Shared(t).CreateDatabase(t)
	raw := openRaw(t, dsn)
	for _, q := range setup {
		if _, err := raw.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	pc, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := driver.ParseConfig([]byte(`
server_cores: 1
budgets:
  - {name: all, mode: enforce, ` + spec + `}
rules:
  - {budget: all, match: {database: ` + strconv.Quote(pc.Database) + `}}
`))
	if err != nil {
		t.Fatal(err)
	}
	db, err := driver.Open(dsn, driver.WithConfig(cfg), driver.WithLogger((&lockedBuffer{}).logger()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, raw
}

var bigJoinTable = []string{
	`create table rv (id int primary key, v int not null)`,
	`insert into rv select g, g from generate_series(1, 200000) g`,
	`analyze rv`,
}

// A pattern whose cost depends on its argument, under explain: call (README: the setting for a
// per_query_limit that must judge every call by its own arguments): a statement with a large
// argument is refused by per_query_limit; then a statement of the same pattern whose own plan
// is tiny is admitted, as its own EXPLAIN shows.
func TestCostCheapArgsAfterExpensiveArgs(t *testing.T) {
	db, _ := openBudgeted(t, "per_query_limit: 200ms, explain: call", bigJoinTable...)
	ctx := context.Background()
	const q = `select count(*) from rv a join rv b on a.v <> b.v where a.id < $1 and b.id < $1`
	var n int64
	err := db.QueryRowContext(ctx, q, 200000).Scan(&n)
	var be *driver.BlockedError
	if !errors.As(err, &be) || be.Reason != driver.ReasonPerQuery {
		t.Fatalf("huge argument: %v, want refused by per_query_limit", err)
	}
	// Tiny: 9 × 9 rows, a few microseconds.
	if err := db.QueryRowContext(ctx, q, 10).Scan(&n); err != nil {
		t.Fatalf("same pattern with a tiny argument (plan of a few rows): %v", err)
	}
}

// A statement refused inside a transaction ("nothing was sent", SafeToRetry) must leave the
// transaction as it was: its EXPLAIN must not leave the table locked.
func TestCostRefusedStatementInTxLeavesNoLock(t *testing.T) {
	db, raw := openBudgeted(t, "per_query_limit: 200ms", bigJoinTable...)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, `delete from rv using rv b where rv.id < $1 and b.id < $1 and rv.v <> b.v`, 200000)
	var be *driver.BlockedError
	if !errors.As(err, &be) {
		t.Fatalf("huge delete: %v, want refused", err)
	}
	if !pgconn.SafeToRetry(err) {
		t.Fatalf("refusal not SafeToRetry")
	}
	_, err = raw.ExecContext(ctx, `begin; lock table rv in share mode nowait; commit`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		t.Fatalf("after a refused DELETE (nothing sent, safe to retry), the transaction holds a lock on rv: another session's LOCK ... SHARE MODE NOWAIT fails: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
}
