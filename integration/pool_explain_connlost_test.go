package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestPoolExplainConnLostOneDecision: a pool statement of a new pattern under a cost budget
// takes a connection for its EXPLAIN; when the server ends that session while the EXPLAIN
// waits on a lock, the connection goes back and the statement, never sent, is decided again
// and takes another. It is still one statement: it succeeds, with one span and one decision
// counted (the first, unfinished decision is neither traced nor counted).
func TestPoolExplainConnLostOneDecision(t *testing.T) {
	const rules = `
budgets:
  - {name: c, mode: enforce, per_query_limit: 5s}
rules:
  - {budget: c, match: {app: c}}
`
	p, spans, ps := telPool(t, "", rules)
	bg := context.Background()
	if _, err := p.Exec(bg, "create table orders (id int, note text)"); err != nil {
		t.Fatal(err)
	}
	cc := p.Config().ConnConfig
	lock := lockTable(t, cc.ConnString(), "orders")
	admin, err := pgx.ConnectConfig(bg, cc)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(bg)
	spans.Reset()

	done := make(chan error, 1)
	go func() {
		_, err := p.Exec(tagging.With(bg, "app", "c"), "select count(*) from orders where id = $1", 1)
		done <- err
	}()
	// The EXPLAIN waits on the lock: end its session.
	var pid int32
	for deadline := time.Now().Add(30 * time.Second); pid == 0; {
		err := admin.QueryRow(bg, `select pid from pg_stat_activity
			where datname = current_database() and wait_event_type = 'Lock' and query ilike 'explain%'`).Scan(&pid)
		if err != nil && err != pgx.ErrNoRows {
			t.Fatal(err)
		}
		if pid == 0 {
			if time.Now().After(deadline) {
				t.Fatal("no EXPLAIN waiting on the lock")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if _, err := admin.Exec(bg, "select pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	if err := lock.Rollback(bg); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the statement failed: %v; want it decided again on another connection and run", err)
	}

	var mine int
	for _, sp := range spans.GetSpans() {
		if telAttr(sp.Attributes, "pgtraffic.tag.app").AsString() == "c" {
			mine++
		}
	}
	if mine != 1 {
		t.Errorf("%d spans for the one statement; want 1", mine)
	}
	decisions := telDecisions(t, ps.metrics(t))
	if n := decisions["c/allow/"]; n != 1 {
		t.Errorf("pgtraffic.decisions counts %d allow(s) of budget c for one statement; want 1 (all: %v)", n, decisions)
	}
}
