package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
)

// gatedSource yields its rows once open is closed: a copy that stays in flight, its text in
// pg_stat_activity, until the test lets it go.
type gatedSource struct {
	open chan struct{}
	i    int
}

func (s *gatedSource) Next() bool {
	<-s.open
	s.i++
	return s.i <= 3
}
func (s *gatedSource) Values() ([]any, error) { return []any{s.i, "x"}, nil }
func (s *gatedSource) Err() error             { return nil }

// TestCopyFingerprintFromPgStatActivity: the incident runbook, for a pgx CopyFrom. An operator
// sees a copy in pg_stat_activity, takes driver.Fingerprint of its text, and blocks that
// fingerprint: the next copy into the table with the same columns is refused, and one with
// other columns is not (it is another statement). Before, a CopyFrom was decided as COPY
// <table> FROM STDIN, whose fingerprint no text in pg_stat_activity carries, and the block
// selected nothing.
func TestCopyFingerprintFromPgStatActivity(t *testing.T) {
	p, dsn := openPool(t, "budgets: []\n")
	ctx := context.Background()
	if _, err := p.Exec(ctx, "create table items (id int, name text)"); err != nil {
		t.Fatal(err)
	}
	src := &gatedSource{open: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := p.CopyFrom(ctx, pgx.Identifier{"items"}, []string{"id", "name"}, src)
		done <- err
	}()
	observer, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer observer.Close(ctx)
	var text string
	for deadline := time.Now().Add(10 * time.Second); text == ""; {
		err := observer.QueryRow(ctx, "select query from pg_stat_activity where query ilike 'copy %' and pid <> pg_backend_pid()").Scan(&text)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if text == "" && time.Now().After(deadline) {
			t.Fatal("the copy never showed in pg_stat_activity")
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(src.open)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	fp := driver.Fingerprint(text)
	cfg, err := driver.ParseConfig(fmt.Appendf(nil, `
budgets:
  - {name: incident-block, mode: enforce, max_concurrent: 0}
rules:
  - {budget: incident-block, match: {fingerprint: %s}}
`, fp))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	rows := pgx.CopyFromRows([][]any{{1, "x"}})
	_, err = p.CopyFrom(ctx, pgx.Identifier{"items"}, []string{"id", "name"}, rows)
	var blocked *driver.BlockedError
	t.Logf("pg_stat_activity: %q, fingerprint %s; the same copy after the block: %v", text, fp, err)
	if !errors.As(err, &blocked) {
		t.Fatalf("a copy whose pg_stat_activity fingerprint %s is blocked ran: %v", fp, err)
	}
	if _, err := p.CopyFrom(ctx, pgx.Identifier{"items"}, []string{"id"}, pgx.CopyFromRows([][]any{{2}})); err != nil {
		t.Fatalf("a copy of other columns, another statement, was refused by the block: %v", err)
	}
}
