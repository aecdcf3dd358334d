package integration

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// A budget with max_duration: 5s, whose statements need an EXPLAIN (per_query_limit).
const explainFailRules = `
budgets:
  - {name: c, mode: enforce, per_query_limit: 5s, max_duration: 5s}
rules:
  - {budget: c, match: {app: c}}
`

// TestExplainFailureIsNotMaxDuration: under a budget with max_duration, an EXPLAIN that fails
// quickly is not a max_duration cut-off. One the server rejects (a bound value: 22P02) falls
// back to history and the statement runs (and fails on the server, as without pgtraffic); one
// the server cancels (lock_timeout: 55P03) answers with the server's error. Neither is counted,
// answered or traced as a block with reason max_duration, nor matches context.Canceled.
func TestExplainFailureIsNotMaxDuration(t *testing.T) {
	type outcome struct {
		err  error
		took time.Duration
	}
	verify := func(t *testing.T, o outcome, wantCode string, decisions map[string]int64, spans tracetest.SpanStubs) {
		t.Helper()
		var pe *pgconn.PgError
		if !errors.As(o.err, &pe) || pe.Code != wantCode {
			t.Errorf("err %v after %v; want the server's SQLSTATE %s", o.err, o.took.Round(time.Millisecond), wantCode)
		}
		if errors.Is(o.err, context.Canceled) {
			t.Errorf("err matches context.Canceled, though the caller's context was never cancelled: %v", o.err)
		}
		if n := decisions["c/block/max_duration"]; n != 0 {
			t.Errorf("pgtraffic.decisions counts %d block(s) with reason max_duration for a statement whose EXPLAIN "+
				"failed after %v under max_duration: 5s (all decisions: %v)", n, o.took.Round(time.Millisecond), decisions)
		}
		for _, sp := range spans {
			if telAttr(sp.Attributes, "pgtraffic.tag.step").AsString() == "x" && telAttr(sp.Attributes, "pgtraffic.reason").AsString() == driver.ReasonMaxDuration {
				t.Errorf("span says %q, decision %s, reason max_duration", sp.Status.Description, telAttr(sp.Attributes, "pgtraffic.decision").AsString())
			}
		}
	}
	ctx := tagging.With(context.Background(), "app", "c", "step", "x")

	t.Run("bad bound value/database/sql", func(t *testing.T) {
		s := newTelSetup(t, explainFailRules)
		t0 := time.Now()
		_, err := s.db.ExecContext(ctx, "select count(*) from orders where id = $1", "notanint")
		o := outcome{err, time.Since(t0)}
		verify(t, o, "22P02", telDecisions(t, s.metrics(t)), s.spans.GetSpans())
	})
	t.Run("bad bound value/pool", func(t *testing.T) {
		p, spans, ps := telPool(t, "", explainFailRules)
		t0 := time.Now()
		_, err := p.Exec(ctx, "select $1::int + 1", "notanint")
		o := outcome{err, time.Since(t0)}
		verify(t, o, "22P02", telDecisions(t, ps.metrics(t)), spans.GetSpans())
	})
	t.Run("lock_timeout/database/sql", func(t *testing.T) {
		s := newTelSetup(t, explainFailRules)
		conn, err := s.db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.ExecContext(context.Background(), "set lock_timeout = '100ms'"); err != nil {
			t.Fatal(err)
		}
		lockSQL(t, s.db, "orders")
		t0 := time.Now()
		_, err = conn.ExecContext(ctx, "select note from orders where id = $1", 1)
		o := outcome{err, time.Since(t0)}
		verify(t, o, "55P03", telDecisions(t, s.metrics(t)), s.spans.GetSpans())
	})
	t.Run("lock_timeout/pool", func(t *testing.T) {
		p, spans, ps := telPool(t, "", explainFailRules)
		if _, err := p.Exec(context.Background(), "create table items (id int)"); err != nil {
			t.Fatal(err)
		}
		c, err := p.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		if _, err := c.Exec(context.Background(), "set lock_timeout = '100ms'"); err != nil {
			t.Fatal(err)
		}
		tx := lockTable(t, p.Config().ConnConfig.ConnString(), "items")
		defer tx.Rollback(context.Background())
		t0 := time.Now()
		_, err = c.Exec(ctx, "select id from items where id = $1", 1)
		o := outcome{err, time.Since(t0)}
		verify(t, o, "55P03", telDecisions(t, ps.metrics(t)), spans.GetSpans())
	})
}

// lockSQL holds an access exclusive lock on table, through a second pgtraffic connection of
// db (no rules select it), until the test ends.
func lockSQL(t *testing.T, db *sql.DB, table string) {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback() })
	if _, err := tx.Exec("lock table " + table + " in access exclusive mode"); err != nil {
		t.Fatal(err)
	}
}
