-- name: GetOrder :one
SELECT * FROM orders
WHERE id = $1;

-- name: ListOrders :many
SELECT * FROM orders
WHERE customer = $1
ORDER BY id;

-- name: CustomerTotals :many
SELECT customer, count(*) AS orders, sum(amount_cents)::bigint AS total_cents
FROM orders
GROUP BY customer
ORDER BY customer;

-- name: CreateOrder :one
INSERT INTO orders (customer, amount_cents)
VALUES ($1, $2)
RETURNING *;

-- name: ShipOrder :exec
UPDATE orders SET status = 'shipped'
WHERE id = $1;

-- name: DeleteAllOrders :exec
DELETE FROM orders;

-- name: CancelOrders :batchexec
UPDATE orders SET status = 'cancelled'
WHERE id = $1;

-- name: CopyOrders :copyfrom
INSERT INTO orders (customer, amount_cents)
VALUES ($1, $2);
