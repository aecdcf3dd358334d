package driver

import (
	"context"
	"database/sql"
	"log/slog"
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

// stallingHandler is an application's slog handler that blocks on a WARN record until release
// is closed (a handler stuck on a full pipe or a slow remote), and counts the ERROR records.
type stallingHandler struct {
	warned  chan struct{} // closed at the first WARN record
	release chan struct{}
}

func (h *stallingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *stallingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *stallingHandler) WithGroup(string) slog.Handler            { return h }
func (h *stallingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn {
		select {
		case <-h.warned:
		default:
			close(h.warned)
		}
		<-h.release
	}
	return nil
}

// panicHandler is an application's slog handler that panics on a WARN or ERROR record.
type panicHandler struct{}

func (panicHandler) Enabled(context.Context, slog.Level) bool { return true }
func (panicHandler) WithAttrs([]slog.Attr) slog.Handler       { return panicHandler{} }
func (panicHandler) WithGroup(string) slog.Handler            { return panicHandler{} }
func (panicHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		panic("the application's handler panicked")
	}
	return nil
}

// leakWithLogger leaks one rows of a max_concurrent: 1 budget under a connector logging to h,
// and returns the connector, whose leaked slot the caller waits for.
func leakWithLogger(t *testing.T, h slog.Handler) *Connector {
	t.Helper()
	cfg, err := ParseConfig([]byte(`
budgets:
  - {name: one, mode: enforce, max_concurrent: 1}
rules:
  - {budget: one, match: {statement: select}}
`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConnector("postgres://u@localhost/db", WithConfig(cfg), WithLogger(slog.New(h)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	db := sql.OpenDB(fakeConnector{conn: &fakeConn{}, intr: c.intr})
	t.Cleanup(func() { db.Close() })
	leakQuery(t, db, "select x from t")
	if n := c.Snapshot().Budgets[0].InFlight; n != 1 {
		t.Fatalf("in flight after the leak: %d", n)
	}
	return c
}

// slotBack collects until c's leaked slot is back, and reports whether it came back.
func slotBack(c *Connector) bool {
	deadline := time.Now().Add(10 * time.Second)
	for c.Snapshot().Budgets[0].InFlight != 0 {
		if time.Now().After(deadline) {
			return false
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	return true
}

// TestLeakedRowsSlotBackWhileLoggerStalls: the leak cleanup gives the slot back before it logs,
// so an application's logger that stalls on the warning keeps no slot; the leak is counted by
// the time the slot is back.
func TestLeakedRowsSlotBackWhileLoggerStalls(t *testing.T) {
	h := &stallingHandler{warned: make(chan struct{}), release: make(chan struct{})}
	defer close(h.release) // lets the cleanup goroutine go on
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	c := leakWithLogger(t, h)
	if !slotBack(c) {
		t.Fatal("the leaked rows' slot did not come back while the logger stalled on the warning")
	}
	if n := c.intr.leaks.n.Load(); n != 1 {
		t.Errorf("leaks counted when the slot is back: %d, want 1", n)
	}
	select {
	case <-h.warned:
	case <-time.After(10 * time.Second):
		t.Error("no warning logged")
	}
}

// TestLeakedRowsLoggerPanicRecovered: a panic of the application's logger on the cleanup
// goroutine is recovered (it would end the process), and the slot comes back.
func TestLeakedRowsLoggerPanicRecovered(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	c := leakWithLogger(t, panicHandler{})
	if !slotBack(c) {
		t.Fatal("the leaked rows' slot did not come back")
	}
	if n := c.intr.leaks.n.Load(); n != 1 {
		t.Errorf("leaks counted: %d, want 1", n)
	}
	// The cleanup's panic, were it not recovered, would end the test binary: give it time to.
	time.Sleep(50 * time.Millisecond)
}

// TestLeaksUserCodeRecovers: userCode recovers f's panic, and a logger that panics on the
// report of it too; a nil leaks recovers as well.
func TestLeaksUserCodeRecovers(t *testing.T) {
	ran := false
	(&leaks{log: slog.New(panicHandler{})}).userCode(func() { panic("user code") })
	(*leaks)(nil).userCode(func() { panic("user code") })
	(&leaks{log: slog.New(panicHandler{})}).userCode(func() { ran = true })
	if !ran {
		t.Error("f did not run")
	}
}
