package integration

import (
	"bytes"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"

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
