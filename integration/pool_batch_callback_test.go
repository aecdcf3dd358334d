package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtraffic/pgtraffic/driver"
)

// TestPoolBatchCallbackOverrun: a batch cut off at its budget's max_duration reports
// the cut with an error that matches driver.ErrOverrun and context.DeadlineExceeded ("max_duration
// on a budget cancels an admitted statement that runs too long (its error matches
// driver.ErrOverrun and context.DeadlineExceeded ...)", README, Rules reference; the batch
// results' comment in driver/poolbatch.go: "Each error matches ErrOverrun when max_duration
// cancelled the batch"). pgx's own recommended way to read a batch is the QueuedQuery
// callbacks (QueryRow, Query), which
// pgx runs from BatchResults.Close: the errors those callbacks are handed must match ErrOverrun
// too, as the same statement's error does when read with BatchResults.QueryRow.
func TestPoolBatchCallbackOverrun(t *testing.T) {
	p := pendingPool(t, 2, `budgets: [{name: b, mode: enforce, max_duration: 300ms}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx

	// Read with BatchResults.QueryRow: the error matches (the reference).
	b := &pgx.Batch{}
	b.Queue("select pg_sleep(5)::text")
	br := p.SendBatch(ctx, b)
	var s string
	direct := br.QueryRow().Scan(&s)
	br.Close()
	if !errors.Is(direct, driver.ErrOverrun) {
		t.Fatalf("BatchResults.QueryRow's error: %v, want ErrOverrun", direct)
	}

	// Read with the callbacks pgx recommends.
	var rowErr, rowsErr error
	b = &pgx.Batch{}
	b.Queue("select pg_sleep(5)::text").QueryRow(func(r pgx.Row) error {
		rowErr = r.Scan(&s)
		return nil // the application handles the error itself, as pgx's callbacks allow
	})
	closeErr := p.SendBatch(ctx, b).Close()
	t.Logf("QueryRow callback: %v; Close: %v", rowErr, closeErr)

	b = &pgx.Batch{}
	b.Queue("select pg_sleep(5)::text").Query(func(rows pgx.Rows) error {
		for rows.Next() {
		}
		rowsErr = rows.Err()
		return nil
	})
	p.SendBatch(ctx, b).Close()
	t.Logf("Query callback: %v", rowsErr)

	for name, err := range map[string]error{"QueuedQuery.QueryRow callback": rowErr, "QueuedQuery.Query callback": rowsErr} {
		if err == nil {
			t.Errorf("%s: no error for a statement cut off at max_duration", name)
			continue
		}
		if !errors.Is(err, driver.ErrOverrun) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: %T %v: matches driver.ErrOverrun %v, context.DeadlineExceeded %v; want both",
				name, err, err, errors.Is(err, driver.ErrOverrun), errors.Is(err, context.DeadlineExceeded))
		}
	}
	rvIdle(t, p, "b")
}

// TestPoolBatchCallbackSemantics: the callbacks of a batch's queued queries, run by Close on the
// pool's batch results, keep pgx's semantics: run in order, none after the first error, whose
// error Close returns (again on a second Close, with no callback run again); and the batch's
// callbacks are its own again once Close returns. Under max_duration, an Exec callback's cut
// reaches the application as Close's error, matching ErrOverrun, and a callback that returns
// its statement's error has it returned by Close as it is (not wrapped twice).
func TestPoolBatchCallbackSemantics(t *testing.T) {
	p := pendingPool(t, 2, `budgets: [{name: b, mode: enforce, max_duration: 300ms}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx

	// No bound cuts it off: a callback's error stops the batch.
	errStop := errors.New("stop")
	var order []string
	b := &pgx.Batch{}
	var firstErr error
	b.Queue("select 1").QueryRow(func(r pgx.Row) error {
		var n int
		if firstErr = r.Scan(&n); firstErr == nil && n != 1 {
			t.Errorf("first QueryRow callback: %d", n)
		}
		order = append(order, "row")
		return nil
	})
	b.Queue("select 2").Exec(func(ct pgconn.CommandTag) error {
		order = append(order, "exec "+ct.String())
		return nil
	})
	b.Queue("select generate_series(1, 3)").Query(func(rows pgx.Rows) error {
		n := 0
		for rows.Next() {
			n++
		}
		order = append(order, fmt.Sprintf("query %d", n))
		return errStop
	})
	b.Queue("select 4").Exec(func(pgconn.CommandTag) error {
		order = append(order, "after the error")
		return nil
	})
	br := p.SendBatch(ctx, b)
	if err := br.Close(); err != errStop {
		t.Errorf("Close: %v, want the callback's error", err)
	}
	if err := br.Close(); err != errStop {
		t.Errorf("second Close: %v, want the callback's error again", err)
	}
	if got := strings.Join(order, ", "); got != "row, exec SELECT 1, query 3" || firstErr != nil {
		t.Errorf("callbacks run: %s; the first one's Scan: %v", got, firstErr)
	}
	// The batch's callbacks are its own again: run on other results, they read those.
	errOther := errors.New("other results")
	if err := b.QueuedQueries[0].Fn(pgx.FailedBatchResults(&pgx.Batch{}, errOther)); err != nil || firstErr != errOther {
		t.Errorf("the first callback, run again on other results: %v, its Scan %v, want %v", err, firstErr, errOther)
	}
	rvIdle(t, p, "b")

	// Cut off: an Exec callback is not called, and Close's error matches.
	called := false
	b = &pgx.Batch{}
	b.Queue("select pg_sleep(5)").Exec(func(pgconn.CommandTag) error {
		called = true
		return nil
	})
	b.Queue("select 1").Exec(func(pgconn.CommandTag) error {
		called = true
		return nil
	})
	br = p.SendBatch(ctx, b)
	err := br.Close()
	if called {
		t.Error("an Exec callback was called for a cut-off statement")
	}
	if !errors.Is(err, driver.ErrOverrun) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close after an Exec callback cut off: %v, want ErrOverrun", err)
	}
	if again := br.Close(); again == nil || again.Error() != err.Error() {
		t.Errorf("second Close: %v, want %v", again, err)
	}
	rvIdle(t, p, "b")

	// Cut off: the callback's error is Close's, as it is.
	var rowErr error
	b = &pgx.Batch{}
	b.Queue("select pg_sleep(5)::text").QueryRow(func(r pgx.Row) error {
		var s string
		rowErr = r.Scan(&s)
		return rowErr
	})
	err = p.SendBatch(ctx, b).Close()
	if !errors.Is(rowErr, driver.ErrOverrun) {
		t.Errorf("QueryRow callback: %v, want ErrOverrun", rowErr)
	}
	if err != rowErr {
		t.Errorf("Close: %v, want the callback's error %v as it is", err, rowErr)
	}
	rvIdle(t, p, "b")
}
