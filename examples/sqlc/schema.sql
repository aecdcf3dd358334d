CREATE TABLE orders (
    id           bigserial   PRIMARY KEY,
    customer     text        NOT NULL,
    amount_cents bigint      NOT NULL,
    status       text        NOT NULL DEFAULT 'new'
);

CREATE INDEX orders_customer ON orders (customer);
