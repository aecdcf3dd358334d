package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestPoolMaxDuration: the pgx-native pool cancels a statement past its budget's max_duration,
// an Exec, a QueryRow and a query whose rows are still being read alike, and leaves others alone.
func TestPoolMaxDuration(t *testing.T) {
	p, dsn := openPool(t, `
budgets:
  - {name: bounded, mode: enforce, max_duration: 300ms}
rules:
  - {budget: bounded, match: {app: reports}}
`)
	ctx := context.Background()
	reports := tagging.With(ctx, "app", "reports")
	check := func(name string, err error, took time.Duration) {
		t.Helper()
		if !errors.Is(err, driver.ErrOverrun) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: error %v, want ErrOverrun and DeadlineExceeded", name, err)
		}
		if took > 3*time.Second {
			t.Errorf("%s: returned after %v", name, took)
		}
	}
	start := time.Now()
	_, err := p.Exec(reports, "select pg_sleep(5)")
	check("exec", err, time.Since(start))

	start = time.Now()
	rows, err := p.Query(reports, "select pg_sleep(0.1), repeat('x', 65536) from generate_series(1, 50)")
	if err == nil {
		for rows.Next() {
		}
		err = rows.Err()
		rows.Close()
	}
	check("rows", err, time.Since(start))

	start = time.Now()
	var slept string
	err = p.QueryRow(reports, "select pg_sleep(5)::text").Scan(&slept)
	check("row", err, time.Since(start))

	// A batch runs under its statements' smallest bound, its results included. The server sends
	// a pipelined batch's results at its end, so the first result waits for the sleep too.
	start = time.Now()
	b := &pgx.Batch{}
	b.Queue("select 1")
	b.Queue("select pg_sleep(5)")
	br := p.SendBatch(reports, b)
	_, err = br.Exec()
	_, err2 := br.Exec()
	err3 := br.Close()
	check("batch", err, time.Since(start))
	check("batch's second result", err2, time.Since(start))
	check("batch's Close", err3, time.Since(start))

	// A copy too, still running past the bound: three million rows take the server seconds.
	// (pgx waits for the source's next buffer before it returns, so a slow source would hold
	// the call past the cancellation; this one is quick.)
	raw := openRaw(t, dsn)
	if _, err := raw.ExecContext(ctx, "create table copy_bounded (n int)"); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	sent := 0
	_, err = p.CopyFrom(reports, pgx.Identifier{"copy_bounded"}, []string{"n"}, pgx.CopyFromFunc(func() ([]any, error) {
		if sent == 3_000_000 {
			return nil, nil
		}
		sent++
		return []any{sent}, nil
	}))
	check("copy", err, time.Since(start))
	if n := poolBudget(t, p, "bounded").BlockedBy["max_duration"]; n != 6 {
		// exec, rows, row, the batch's two statements, and the copy
		t.Errorf("max_duration blocks counted: %d, want 6", n)
	}
	var n int
	if !eventually(2*time.Second, func() bool {
		err := raw.QueryRowContext(ctx, "select count(*) from pg_stat_activity where state = 'active' and query like '%pg_sleep%' and pid <> pg_backend_pid()").Scan(&n)
		return err == nil && n == 0
	}) {
		t.Errorf("%d backends still running pg_sleep after the overruns", n)
	}

	// Within the bound, and of no budget: untouched.
	if _, err := p.Exec(reports, "select pg_sleep(0.01)"); err != nil {
		t.Fatalf("within the bound: %v", err)
	}
	if _, err := p.Exec(ctx, "select pg_sleep(0.5)"); err != nil {
		t.Fatalf("no budget: %v", err)
	}
}
