package runtime

import (
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/engine"
)

// TestChangeDuringFirstLoadIsSeen: a file replaced while WatchFile's first load parses and
// compiles it (a ConfigMap update while the pod starts; a large generated file takes a while
// to compile) is applied: the directory is watched before the first read, so the replacement's
// events wait for the watcher. The test replaces the file at the moment the first load
// compiles (the engine reads its clock there).
func TestChangeDuringFirstLoadIsSeen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	write := func(content string) {
		t.Helper()
		tmp := filepath.Join(dir, ".rules.tmp")
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil { // as kubelet and editors do
			t.Fatal(err)
		}
	}
	write("budgets:\n  - {name: old, mode: enforce, max_concurrent: 2}\n")

	var armed atomic.Bool
	h := &watchHarness{t: t, reloaded: make(chan struct{}, 100), failed: make(chan string, 100), warned: make(chan string, 100)}
	h.r, h.clk = newRuntime(t, "", func(o *engine.Options) {
		o.Logger = slog.New(reloadLog{h.reloaded, h.failed, h.warned})
		now := o.Now
		o.Now = func() time.Time {
			if armed.CompareAndSwap(true, false) {
				write("budgets:\n  - {name: new, mode: enforce, max_concurrent: 1}\n")
			}
			return now()
		}
	})
	armed.Store(true)
	if err := h.r.WatchFile(path, 0); err != nil {
		t.Fatal(err)
	}
	if armed.Load() {
		t.Fatal("the first load never read the clock: the file was not replaced during it")
	}
	select {
	case <-h.reloaded: // the first load
	default:
	}
	h.runUntilReload()
	if got := h.inForce(); got != "new:enforce" {
		t.Fatalf("in force %s: the file replaced while the first load compiled is never applied; want new:enforce", got)
	}
}
