package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestTxOutlivesDBCloseNotRefusedAsStale: a graceful shutdown calls
// (*sql.DB).Close while requests still finish their transactions. database/sql lets a
// connection in use outlive Close (its statements still run; only new ones are refused), and
// Connector.Close promises only that statements *waiting* for capacity return ErrClosed. The
// pgx-native Pool keeps its health sampler until its connections are released. On
// database/sql, though, Close stops the health sampler at once: were health still judged,
// three health intervals later every statement of the transaction still in flight on a
// throttle_when budget would be refused with reason health, "sample is stale", and a
// RetryAfter that never comes true. The transaction's statement runs (the rules in force at
// the close, as the runtime's Close says), never refused with a retryable health refusal.
func TestTxOutlivesDBCloseNotRefusedAsStale(t *testing.T) {
	_, db := openRules(t, `health_interval: 100ms
budgets: [{name: h, mode: enforce, throttle_when: {active_queries: 1000}}]
rules: [{budget: h, match: {app: h}}]`)
	ctx := tagging.With(context.Background(), "app", "h")
	if !eventually(10*time.Second, func() bool { _, err := db.ExecContext(ctx, "select 1"); return err == nil }) {
		t.Fatal("the health budget never admitted a statement")
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "select 1"); err != nil {
		t.Fatalf("the transaction's first statement: %v", err)
	}

	db.Close() // shutdown begins; the request holding tx is still finishing its work

	time.Sleep(time.Second) // ten health intervals: a sample not renewed is stale by now
	_, err = tx.ExecContext(ctx, "select 2")
	var be *driver.BlockedError
	if errors.As(err, &be) && be.Reason == driver.ReasonHealth {
		t.Fatalf("a statement of a transaction in flight at (*sql.DB).Close was refused as %v "+
			"(reason %s, RetryAfter %v): the connector's health sampler was stopped while the "+
			"connection was still in use, so no retry can ever pass", err, be.Reason, be.RetryAfter)
	}
	if err != nil && !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("a statement of a transaction in flight at (*sql.DB).Close: %v; want it run (or ErrClosed)", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit: %v", err)
	}
}
