package integration

import (
	"context"
	"database/sql/driver"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// explainEveryCall is a budget under which every statement is explained first.
const explainEveryCall = `budgets: [{name: q, mode: enforce, per_query_limit: 10s, explain: call}]
rules: [{budget: q, match: {username: postgres}}]
`

// TestSessionEndedUnderExplainKeepsServerError: the server ends a transaction's session
// (pg_terminate_backend) and its next statement's EXPLAIN meets the FATAL. The statement is
// answered with the server's error, as without pgtraffic: a *pgconn.PgError of SQLSTATE 57P01,
// on a pool transaction and on a database/sql one (there beside driver.ErrBadConn, on which
// database/sql retries a statement outside a transaction, as it does here). Before, the pool
// sent the statement to the closed connection ("conn closed", no SQLSTATE), and database/sql
// answered a bare driver.ErrBadConn.
func TestSessionEndedUnderExplainKeepsServerError(t *testing.T) {
	ctx := context.Background()
	p, dsn := openPool(t, explainEveryCall)
	_, db := openRulesOn(t, dsn, explainEveryCall)
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	terminate := func(pid int) {
		t.Helper()
		if _, err := admin.Exec(ctx, "select pg_terminate_backend($1)", pid); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // the FATAL reaches the client's socket
	}
	wantTerminated := func(front string, err error) {
		t.Helper()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.AdminShutdown {
			t.Errorf("%s: the statement after its session ended: %v, want the server's 57P01", front, err)
		}
	}

	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := tx.QueryRow(ctx, "select pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	terminate(pid)
	_, err = tx.Exec(ctx, "select 1")
	wantTerminated("pool transaction", err)
	_ = tx.Rollback(ctx)

	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := stx.QueryRowContext(ctx, "select pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	terminate(pid)
	_, err = stx.ExecContext(ctx, "select 1")
	wantTerminated("database/sql transaction", err)
	if !errors.Is(err, driver.ErrBadConn) {
		t.Errorf("database/sql transaction: %v, want driver.ErrBadConn beside the server's error", err)
	}
	_ = stx.Rollback()

	// Outside a transaction database/sql retries the statement, unsent, on another connection.
	db.SetMaxIdleConns(1)
	if err := db.QueryRowContext(ctx, "select pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	terminate(pid)
	var one int
	if err := db.QueryRowContext(ctx, "select 1").Scan(&one); err != nil {
		t.Errorf("database/sql outside a transaction after its idle connection's session ended: %v, want retried", err)
	}
}
