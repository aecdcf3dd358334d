package integration

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

const explainCallRules = `budgets:
  - {name: q, mode: enforce, per_query_limit: 1s, explain: call}
rules:
  - {budget: q, match: {username: postgres}}
`

// TestExplainCallJudgesEveryCall: under explain: call, per_query_limit judges every call by its
// own arguments, on database/sql and on the pgx-native pool alike, whose statement takes its
// connection first to be explained. A pattern learned cheap with small arguments, then called
// with an argument that makes it a billion-row query, is refused before it is sent. The pool
// priced its statements by the pattern's cached plan (0 EXPLAINs for 3 calls), admitted the
// call and ran it until the test's deadline.
func TestExplainCallJudgesEveryCall(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.Shared(t).CreateDatabase(t)
	cfg, err := driver.ParseConfig([]byte(explainCallRules))
	if err != nil {
		t.Fatal(err)
	}
	const q = "select count(*) from generate_series(1, $1::int8)"
	type front struct {
		name string
		run  func(ctx context.Context, n int64) error
		snap func() driver.Snapshot
	}
	c, err := driver.NewConnector(dsn, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	defer db.Close()
	p, err := driver.NewPool(ctx, dsn, driver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	fronts := []front{
		{"database/sql", func(ctx context.Context, n int64) error {
			var x int64
			return db.QueryRowContext(ctx, q, n).Scan(&x)
		}, c.Snapshot},
		{"pool QueryRow", func(ctx context.Context, n int64) error {
			var x int64
			return p.QueryRow(ctx, q, n).Scan(&x)
		}, p.Snapshot},
		{"pool Exec", func(ctx context.Context, n int64) error {
			_, err := p.Exec(ctx, q, n)
			return err
		}, p.Snapshot},
		{"pool SendBatch", func(ctx context.Context, n int64) error {
			b := &pgx.Batch{}
			b.Queue(q+" as b", n)
			return p.SendBatch(ctx, b).Close()
		}, p.Snapshot},
	}
	for _, f := range fronts {
		for i := 0; i < 20; i++ {
			if err := f.run(ctx, 1000); err != nil {
				t.Fatalf("%s: small call: %v", f.name, err)
			}
		}
		before := f.snap().Counters.ExplainCalls
		for i := 0; i < 3; i++ {
			if err := f.run(ctx, 1000); err != nil {
				t.Fatalf("%s: small call: %v", f.name, err)
			}
		}
		explains := f.snap().Counters.ExplainCalls - before
		tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		start := time.Now()
		err := f.run(tctx, 10_000_000_000)
		cancel()
		var be *driver.BlockedError
		t.Logf("%s: %d EXPLAINs for 3 calls; the billion-row call: %v after %v", f.name, explains, err, time.Since(start).Round(time.Millisecond))
		if explains != 3 {
			t.Errorf("%s: %d EXPLAINs for 3 calls under explain: call, want 3", f.name, explains)
		}
		if !errors.As(err, &be) || be.Reason != driver.ReasonPerQuery {
			t.Errorf("%s: the billion-row call was not refused by per_query_limit before it was sent: %v", f.name, err)
		}
	}
}
