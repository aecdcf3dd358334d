package driver

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a log destination safe for the cleanup goroutine and the test's.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// leakQuery runs a query and drops its rows without closing them, as a forgotten
// defer rows.Close() does.
//
//go:noinline
func leakQuery(t *testing.T, db *sql.DB, q string) {
	rows, err := db.QueryContext(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	_ = rows.Next()
}

// TestLeakedRowsReclaimed: rows dropped without Close hold their max_concurrent slot until the
// garbage collector finds them; then the slot comes back, counted and logged.
func TestLeakedRowsReclaimed(t *testing.T) {
	var logs syncBuffer
	cfg, err := ParseConfig([]byte(`
budgets:
  - {name: one, mode: enforce, max_concurrent: 1}
rules:
  - {budget: one, match: {statement: select}}
`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConnector("postgres://u@localhost/db", WithConfig(cfg),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	db := sql.OpenDB(fakeConnector{conn: &fakeConn{}, intr: c.intr})
	defer db.Close()
	// No collection but the test's own: one between the leak and the check below would reclaim
	// the slots before the check sees them held.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))

	leakQuery(t, db, "select x from t")
	// The leaked rows hold the slot: a second select is blocked.
	if _, err := db.Query("select x from t"); !errors.Is(err, ErrBlocked) {
		t.Fatalf("second select while the leaked rows are reachable or uncollected: %v", err)
	}
	for i := 0; i < 1000 && c.Snapshot().Budgets[0].InFlight != 0; i++ {
		runtime.GC() // the cleanup runs on its own goroutine after a collection finds the rows
	}
	if n := c.Snapshot().Budgets[0].InFlight; n != 0 {
		t.Fatalf("in flight after collections: %d, want the leaked slot back", n)
	}
	rows, err := db.Query("select x from t")
	if err != nil {
		t.Fatalf("select after the leaked rows were collected: %v", err)
	}
	rows.Close()
	if n := c.intr.leaks.n.Load(); n != 1 {
		t.Errorf("leaks counted: %d, want 1", n)
	}
	// The warning is logged once the slot is back (leak.go, reclaim): wait for it.
	logged := func() bool {
		return strings.Contains(logs.String(), "level=WARN") && strings.Contains(logs.String(), "rows garbage-collected without Close")
	}
	for deadline := time.Now().Add(10 * time.Second); !logged() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if !logged() {
		t.Errorf("no warning logged:\n%s", logs.String())
	}
}

// TestClosedRowsNotCountedAsLeaks: rows closed (or exhausted) and then collected, with their
// connection, are not leaks.
func TestClosedRowsNotCountedAsLeaks(t *testing.T) {
	fc := &fakeConn{}
	c, db := fakeDB(t, `
budgets:
  - {name: one, mode: enforce, max_concurrent: 1}
rules:
  - {budget: one, match: {statement: select}}
`, fc)
	db.SetMaxIdleConns(0) // connections are closed, and collected, after each use
	for i := 0; i < 20; i++ {
		rows, err := db.Query("select x from t")
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			for rows.Next() {
			}
		}
		rows.Close()
	}
	for i := 0; i < 10; i++ {
		runtime.GC()
	}
	if n := c.intr.leaks.n.Load(); n != 0 {
		t.Errorf("leaks counted: %d, want 0", n)
	}
}
