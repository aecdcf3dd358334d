package runtime

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
)

// TestBusyNeighbourFileDoesNotDelayReload: the rules file lives in a directory where another
// file changes often (the README's quick start watches "rules.yaml" in the working directory,
// where an application's log may be written every few hundred ms). The rules file itself is
// written once and then left alone, so the change is in force within a second: events naming
// other files of the directory do not restart the watcher's wait.
func TestBusyNeighbourFileDoesNotDelayReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, []byte("budgets:\n  - {name: old, mode: enforce, max_concurrent: 2}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := newWatchHarness(t, path)
	t0 := h.clk.Now()
	if err := os.WriteFile(path, []byte("budgets:\n  - {name: new, mode: enforce, max_concurrent: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.waitTimer("saw the rules file written", func(tm fakeclock.Timer) bool { return tm.At.Equal(t0.Add(settle)) })

	log, err := os.OpenFile(filepath.Join(dir, "app.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	const tick = 200 * time.Millisecond // a log line every 200 ms
	reloaded := false
	for i := 0; i < 15 && !reloaded; i++ { // 3 s
		h.clk.Advance(tick)
		if _, err := log.WriteString("a log line\n"); err != nil {
			t.Fatal(err)
		}
		// Let the watcher see the line (it sets a settle timer for it) before time moves on.
		now, wait := h.clk.Now(), time.After(200*time.Millisecond)
	seen:
		for {
			select {
			case tm := <-h.clk.Set():
				if !tm.At.Before(now.Add(settle)) {
					break seen
				}
			case <-h.reloaded:
				reloaded = true
				break seen
			case <-wait: // a watcher that ignores the log sets no timer for it
				break seen
			}
		}
	}
	if got := h.inForce(); got != "new:enforce" {
		t.Fatalf("in force %s after the rules file was left unchanged for %v while another file in its directory"+
			" was appended to every %v; want new:enforce (in force within a second)", got, h.clk.Now().Sub(t0), tick)
	}
}
