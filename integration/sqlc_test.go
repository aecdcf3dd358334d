package integration

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/examples/sqlc/db"
)

// TestSqlcOnPool: the package sqlc generated for pgx/v5 (examples/sqlc/db) runs unchanged on a
// *driver.Pool: :one, :many, :exec, :batchexec, :copyfrom, and WithTx on a transaction from
// Pool.Begin; a budget whose rule matches query_name refuses that one query and no other.
func TestSqlcOnPool(t *testing.T) {
	p, _ := openPool(t, `
budgets:
  - {name: totals, mode: enforce, per_query_limit: 1us}
rules:
  - {budget: totals, match: {query_name: CustomerTotals}}
`)
	ctx := context.Background()
	schema, err := os.ReadFile("../examples/sqlc/schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, string(schema)); err != nil {
		t.Fatal(err)
	}
	q := db.New(p)
	n, err := q.CopyOrders(ctx, []db.CopyOrdersParams{{Customer: "a", AmountCents: 100}, {Customer: "a", AmountCents: 200}, {Customer: "b", AmountCents: 50}})
	if err != nil || n != 3 {
		t.Fatalf("CopyOrders (:copyfrom): %d, %v", n, err)
	}
	o, err := q.CreateOrder(ctx, db.CreateOrderParams{Customer: "b", AmountCents: 75})
	if err != nil || o.ID != 4 || o.Status != "new" {
		t.Fatalf("CreateOrder (:one): %+v, %v", o, err)
	}
	if err := q.ShipOrder(ctx, o.ID); err != nil {
		t.Fatalf("ShipOrder (:exec): %v", err)
	}
	if o, err = q.GetOrder(ctx, o.ID); err != nil || o.Status != "shipped" {
		t.Fatalf("GetOrder (:one): %+v, %v", o, err)
	}
	list, err := q.ListOrders(ctx, "a")
	if err != nil || len(list) != 2 {
		t.Fatalf("ListOrders (:many): %+v, %v", list, err)
	}
	var batchErrs []error
	q.CancelOrders(ctx, []int64{list[0].ID, list[1].ID}).Exec(func(_ int, err error) { batchErrs = append(batchErrs, err) })
	if len(batchErrs) != 2 || batchErrs[0] != nil || batchErrs[1] != nil {
		t.Fatalf("CancelOrders (:batchexec): %v", batchErrs)
	}
	if list, err = q.ListOrders(ctx, "a"); err != nil || list[0].Status != "cancelled" || list[1].Status != "cancelled" {
		t.Fatalf("after CancelOrders: %+v, %v", list, err)
	}

	// The budget selects CustomerTotals by its name, and no other generated query.
	_, err = q.CustomerTotals(ctx)
	var be *driver.BlockedError
	if !errors.As(err, &be) || be.Budget != "totals" || be.Reason != driver.ReasonPerQuery {
		t.Fatalf("CustomerTotals: %v, want a per_query_limit refusal by totals", err)
	}
	if b := poolBudget(t, p, "totals"); b.Admitted != 0 || b.Blocked != 1 {
		t.Fatalf("totals admitted %d, blocked %d: want only CustomerTotals selected (0, 1)", b.Admitted, b.Blocked)
	}

	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	qtx := q.WithTx(tx)
	if _, err := qtx.CustomerTotals(ctx); !errors.As(err, &be) || be.Budget != "totals" {
		t.Fatalf("CustomerTotals in the transaction: %v, want refused by totals", err)
	}
	o, err = qtx.CreateOrder(ctx, db.CreateOrderParams{Customer: "c", AmountCents: 1})
	if err != nil {
		t.Fatalf("CreateOrder in the transaction: %v", err)
	}
	if err := qtx.ShipOrder(ctx, o.ID); err != nil {
		t.Fatalf("ShipOrder in the transaction: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if o, err = q.GetOrder(ctx, o.ID); err != nil || o.Status != "shipped" {
		t.Fatalf("after the commit: %+v, %v", o, err)
	}
	if b := poolBudget(t, p, "totals"); b.Admitted != 0 || b.Blocked != 2 {
		t.Fatalf("totals admitted %d, blocked %d, want 0, 2", b.Admitted, b.Blocked)
	}
}
