package integration

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	pgtdriver "github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// slowStartTracer is a pgx QueryTracer whose TraceQueryStart takes a while, as a tracer that
// exports synchronously, or a GC pause or a busy scheduler between admission and send, does.
type slowStartTracer struct {
	delay time.Duration
	calls atomic.Int64
}

func (s *slowStartTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL == "select 42" {
		s.calls.Add(1)
		time.Sleep(s.delay)
	}
	return ctx
}

func (s *slowStartTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A statement whose max_duration ends before pgx sent it (pgx reports a SafeToRetry error, which
// its stdlib turns into driver.ErrBadConn) is cut off by its budget: its error must match
// ErrOverrun and not driver.ErrBadConn, or database/sql retries it on other connections (deciding
// it and counting an overrun again each time, and closing healthy connections).
func TestSQLOverrunBeforeSendNotRetried(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	tr := &slowStartTracer{delay: 30 * time.Millisecond}
	cc.Tracer = tr
	cfg, err := pgtdriver.ParseConfig([]byte(`
budgets:
  - {name: b, mode: enforce, max_duration: 10ms}
rules:
  - {budget: b, match: {app: x}}
`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgtdriver.NewConnectorFromConfig(cc, pgtdriver.WithConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	defer db.Close()
	db.SetMaxIdleConns(4)
	// Warm up a few idle connections.
	for range 3 {
		if err := db.Ping(); err != nil {
			t.Fatal(err)
		}
	}
	ctx := tagging.With(context.Background(), "app", "x")
	_, err = db.ExecContext(ctx, "select 42")
	check(t, c, tr, err, 1)
	rows, err := db.QueryContext(ctx, "select 42")
	if err == nil {
		rows.Close()
	}
	check(t, c, tr, err, 2)
}

func check(t *testing.T, c *pgtdriver.Connector, tr *slowStartTracer, err error, want int) {
	t.Helper()
	b := budgetStatus(t, c, "b")
	t.Logf("error: %v; sent %d times; budget admitted %d, blocked %v", err, tr.calls.Load(), b.Admitted, b.BlockedBy)
	if !errors.Is(err, pgtdriver.ErrOverrun) {
		t.Errorf("error %v, want ErrOverrun", err)
	}
	if errors.Is(err, driver.ErrBadConn) {
		t.Errorf("the overrun's error matches driver.ErrBadConn")
	}
	if n := tr.calls.Load(); n != int64(want) || b.Admitted != uint64(want) || b.BlockedBy["max_duration"] != uint64(want) {
		t.Errorf("after %d statements: sent %d times by database/sql, decided %d times, counted %d overruns",
			want, n, b.Admitted, b.BlockedBy["max_duration"])
	}
}
