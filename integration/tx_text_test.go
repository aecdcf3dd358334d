package integration

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestTransactionTextNeverRefused: a transaction's own statements sent as text (what GORM and
// bun send for nested transactions, or an application's "commit") are never refused, as the
// drivers' own Begin and Commit are not: an incident rule closing a tenant's budget while its
// transactions are open must not leave them open, holding their locks, by refusing the
// ROLLBACK TO SAVEPOINT, RELEASE or COMMIT that ends them. The transaction's other statements
// are refused as any.
func TestTransactionTextNeverRefused(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	const open = "budgets: [{name: b, mode: enforce, max_concurrent: 4}]\nrules: [{budget: b, match: {app: t}}]\n"
	const closed = "budgets: [{name: b, mode: enforce, max_concurrent: 0}]\nrules: [{budget: b, match: {app: t}}]\n"
	bg := context.Background()
	admin, err := pgx.Connect(bg, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(bg)
	if _, err := admin.Exec(bg, "create table tx_text (front text)"); err != nil {
		t.Fatal(err)
	}
	ctx := tagging.With(bg, "app", "t")
	p := openSizedPool(t, dsn, 2, driver.WithConfig(poolRules(t, open)))
	c, db := openSizedDB(t, dsn, 2, driver.WithConfig(poolRules(t, open)))
	for _, fe := range []txFront{
		func() (fe txFront) {
			pc, err := p.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			fe.name, fe.release = "PoolConn", pc.Release
			fe.exec = func(q string) error { _, err := pc.Exec(ctx, q); return err }
			fe.close = func(rules string) error { return p.SetConfig(poolRules(t, rules)) }
			fe.inTx = func() bool { return pc.Conn().PgConn().TxStatus() != 'I' }
			return fe
		}(),
		func() (fe txFront) {
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			fe.name, fe.release = "sql.Conn", func() { conn.Close() }
			fe.exec = func(q string) error { _, err := conn.ExecContext(ctx, q); return err }
			fe.close = func(rules string) error { return c.SetConfig(poolRules(t, rules)) }
			fe.inTx = func() bool {
				var status byte
				conn.Raw(func(dc any) error {
					status = dc.(interface{ Conn() *pgx.Conn }).Conn().PgConn().TxStatus()
					return nil
				})
				return status != 'I'
			}
			return fe
		}(),
	} {
		t.Run(fe.name, func(t *testing.T) {
			defer fe.release()
			if err := fe.close(open); err != nil {
				t.Fatal(err)
			}
			for _, q := range []string{"begin", "insert into tx_text values ('" + fe.name + "')", "savepoint s"} {
				if err := fe.exec(q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			if err := fe.close(closed); err != nil { // the incident rule, mid-transaction
				t.Fatal(err)
			}
			var blocked *driver.BlockedError
			if err := fe.exec("insert into tx_text values ('refused')"); !errors.As(err, &blocked) {
				t.Fatalf("an insert under the closed budget: %v; want it refused", err)
			}
			for _, q := range []string{"rollback to savepoint s", "release savepoint s", "savepoint s2", "commit"} {
				if err := fe.exec(q); err != nil {
					t.Fatalf("%s under the closed budget: %v; want it run", q, err)
				}
			}
			if fe.inTx() {
				t.Fatal("the session is still in its transaction after COMMIT")
			}
			var n int
			if err := admin.QueryRow(bg, "select count(*) from tx_text where front = $1", fe.name).Scan(&n); err != nil || n != 1 {
				t.Fatalf("%d rows committed (%v); want 1", n, err)
			}
		})
	}
}

// txFront is a connection of one front end held for a transaction sent as text.
type txFront struct {
	name    string
	exec    func(q string) error     // sends q on the held connection
	close   func(rules string) error // puts rules in force on the front end
	inTx    func() bool              // the session is in a transaction
	release func()                   // gives the connection back
}
