// Command sqlc runs the queries sqlc generated for pgx/v5 (package db, unchanged) on a
// *driver.Pool over a throwaway PostgreSQL: the generated :one, :many, :exec, :batchexec and
// :copyfrom methods, a budget selected by sqlc's query name for one report, the require_where
// guard stopping a generated DELETE without WHERE, and a transaction through WithTx.
//
//	go run ./examples/sqlc
//
// Set PGTRAFFIC_TEST_DSN to use an existing server instead of a throwaway one.
package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/examples/sqlc/db"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

//go:embed schema.sql
var schema string

// The reporting budget selects one generated query by the name in its "-- name:" comment.
const rules = `
server_cores: 1
budgets:
  - name: reporting
    mode: enforce
    server_share: 0.05      # 5% of one core in the long run: the bucket drains 50ms per second
    burst_limit: 200ms      # at most 200ms of execution in a burst
rules:
  - budget: reporting
    match: {query_name: CustomerTotals}
guards:
  require_where: enforce
`

const customers, rowsPerCustomer = 1000, 200

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx := context.Background()
	dsn, stop, err := pgtest.EnvOrStart()
	if err != nil {
		return err
	}
	defer stop()
	cfg, err := driver.ParseConfig([]byte(rules))
	if err != nil {
		return err
	}
	pool, err := driver.NewPool(ctx, dsn, driver.WithConfig(cfg))
	if err != nil {
		return err
	}
	defer pool.Close()
	q := db.New(pool) // the generated package takes the pool as its DBTX

	section("1. The generated methods on *driver.Pool")
	if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS orders"); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, schema); err != nil {
		return err
	}
	batch := make([]db.CopyOrdersParams, 0, customers*rowsPerCustomer)
	for i := range customers * rowsPerCustomer {
		batch = append(batch, db.CopyOrdersParams{Customer: fmt.Sprintf("c%d", i%customers), AmountCents: int64(i%97) * 150})
	}
	n, err := q.CopyOrders(ctx, batch) // :copyfrom, decided as the COPY pgx sends
	if err != nil {
		return err
	}
	fmt.Printf("CopyOrders (:copyfrom): %d rows\n", n)
	if _, err := pool.Exec(ctx, "ANALYZE orders"); err != nil {
		return err
	}
	o, err := q.CreateOrder(ctx, db.CreateOrderParams{Customer: "c7", AmountCents: 1999})
	if err != nil {
		return err
	}
	fmt.Printf("CreateOrder (:one): order %d, status %s\n", o.ID, o.Status)
	if err := q.ShipOrder(ctx, o.ID); err != nil {
		return err
	}
	if o, err = q.GetOrder(ctx, o.ID); err != nil {
		return err
	}
	fmt.Printf("ShipOrder (:exec), GetOrder (:one): order %d is %s\n", o.ID, o.Status)
	list, err := q.ListOrders(ctx, "c7")
	if err != nil {
		return err
	}
	fmt.Printf("ListOrders (:many): customer c7 has %d orders\n", len(list))
	cancelled := 0
	q.CancelOrders(ctx, []int64{list[0].ID, list[1].ID, list[2].ID}).Exec(func(_ int, err error) {
		if err == nil {
			cancelled++
		}
	})
	fmt.Printf("CancelOrders (:batchexec): %d orders cancelled in one batch\n", cancelled)

	section("2. The reporting budget selects CustomerTotals, and only it")
	var blocked *driver.BlockedError
	for i := 1; i <= 30; i++ {
		totals, err := q.CustomerTotals(ctx)
		if errors.As(err, &blocked) {
			fmt.Printf("report %d: BLOCKED: %v\n", i, err)
			break
		}
		if err != nil {
			return err
		}
		fmt.Printf("report %d: ok (%d customers)", i, len(totals))
		// The other generated queries are not selected by the budget: they run regardless.
		if _, err := q.ListOrders(ctx, "c7"); err != nil {
			return err
		}
		fmt.Println(", and ListOrders beside it: ok")
	}
	if blocked == nil {
		fmt.Println("the bucket never filled (a very fast machine)")
	} else {
		list, err := q.ListOrders(ctx, "c7")
		fmt.Printf("while the report is refused, ListOrders: %d orders, error %v\n", len(list), err)
		fmt.Printf("waiting RetryAfter = %v ...\n", blocked.RetryAfter)
		time.Sleep(blocked.RetryAfter)
		if _, err := q.CustomerTotals(ctx); err != nil {
			return fmt.Errorf("after RetryAfter: %w", err)
		}
		fmt.Println("after RetryAfter: the report runs again")
	}

	section("3. The require_where guard, and WithTx on a transaction from Pool.Begin")
	err = q.DeleteAllOrders(ctx)
	fmt.Printf("DeleteAllOrders (DELETE FROM orders): %v\n", err)
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	qtx := q.WithTx(tx)
	o, err = qtx.CreateOrder(ctx, db.CreateOrderParams{Customer: "c8", AmountCents: 500})
	if err != nil {
		return err
	}
	err = qtx.DeleteAllOrders(ctx)
	fmt.Printf("in the transaction, DeleteAllOrders: %v\n", err)
	if err := qtx.ShipOrder(ctx, o.ID); err != nil {
		return fmt.Errorf("the transaction stays usable after a refusal: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	if o, err = q.GetOrder(ctx, o.ID); err != nil {
		return err
	}
	var count int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM orders").Scan(&count); err != nil {
		return err
	}
	fmt.Printf("committed: order %d is %s; orders still has %d rows\n", o.ID, o.Status, count)

	section("4. Budget state")
	for _, b := range pool.Snapshot().Budgets {
		fmt.Printf("budget %s (%s): debt %.3fs, in flight %d, admitted %d, blocked %d\n",
			b.Name, b.Mode, b.Debt, b.InFlight, b.Admitted, b.Blocked)
	}
	return nil
}

func section(title string) {
	fmt.Printf("\n== %s %s\n", title, strings.Repeat("=", max(0, 90-len(title))))
}
