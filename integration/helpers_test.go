package integration

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// lockedBuffer collects log output from many goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *lockedBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// privateServer starts a throwaway cluster that a test may stop, restart or pause. It fails on
// any start error, except when the suite runs against an external server (PGTRAFFIC_TEST_DSN)
// outside CI, where such a test is skipped: it cannot stop somebody else's server.
func privateServer(t *testing.T) *pgtest.Server {
	t.Helper()
	pgtest.Shared(t) // skips (or fails under CI) when PostgreSQL is missing
	srv, err := pgtest.Start()
	if err != nil {
		if os.Getenv("PGTRAFFIC_TEST_DSN") != "" && !pgtest.Required() {
			t.Skipf("needs a throwaway cluster next to PGTRAFFIC_TEST_DSN: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	return srv
}

// lockTable takes an access exclusive lock on table of the database at dsn, as a migration
// does, in a transaction of a connection of its own, and returns that transaction: its Commit
// releases the lock. The lock is released and the connection closed when the test ends.
func lockTable(t *testing.T, dsn, table string) pgx.Tx {
	t.Helper()
	bg := context.Background()
	conn, err := pgx.Connect(bg, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(bg) })
	tx, err := conn.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(bg) })
	if _, err := tx.Exec(bg, "lock table "+pgx.Identifier{table}.Sanitize()+" in access exclusive mode"); err != nil {
		t.Fatal(err)
	}
	return tx
}
