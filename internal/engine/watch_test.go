package engine

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
)

// watchClock is a fake clock for the rules-file watcher: it records every timer set, so a test
// can wait for the watcher to have reacted to an event or a read, and fires them when advanced.
// The file events themselves are real (fsnotify), so the tests wait for them with a real-time
// failsafe, never a sleep.
type watchClock struct {
	mu     sync.Mutex
	t      time.Time
	timers []watchTimer // set and not fired yet
	set    chan watchTimer
}

type watchTimer struct {
	at time.Time
	d  time.Duration
	c  chan time.Time
}

func newWatchClock() *watchClock {
	return &watchClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), set: make(chan watchTimer, 1000)}
}

func (c *watchClock) after(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	tm := watchTimer{at: c.t.Add(d), d: d, c: make(chan time.Time, 1)}
	c.timers = append(c.timers, tm)
	c.mu.Unlock()
	c.set <- tm
	return tm.c
}

func (c *watchClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// advance moves the clock forward by d and fires the timers due.
func (c *watchClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	kept := c.timers[:0]
	for _, tm := range c.timers {
		if tm.at.After(c.t) {
			kept = append(kept, tm)
			continue
		}
		tm.c <- c.t
	}
	c.timers = kept
}

// earliest returns how far the earliest pending timer is, false if none is.
func (c *watchClock) earliest() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.timers) == 0 {
		return 0, false
	}
	at := c.timers[0].at
	for _, tm := range c.timers[1:] {
		if tm.at.Before(at) {
			at = tm.at
		}
	}
	return at.Sub(c.t), true
}

// reloadLog is a slog handler that reports each "rules reloaded" record on a channel.
type reloadLog struct{ reloaded chan struct{} }

func (h reloadLog) Enabled(context.Context, slog.Level) bool { return true }
func (h reloadLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h reloadLog) WithGroup(string) slog.Handler            { return h }
func (h reloadLog) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "rules reloaded") {
		h.reloaded <- struct{}{}
	}
	return nil
}

// watchHarness is an engine watching path with a fake clock.
type watchHarness struct {
	t        *testing.T
	e        *Engine
	clk      *watchClock
	reloaded chan struct{}
}

func newWatchHarness(t *testing.T, path string) *watchHarness {
	t.Helper()
	h := &watchHarness{t: t, clk: newWatchClock(), reloaded: make(chan struct{}, 100)}
	h.e, _ = newEngine(t, "", func(o *Options) {
		o.Logger, o.Now, o.After = slog.New(reloadLog{h.reloaded}), h.clk.now, h.clk.after
	})
	if err := h.e.WatchFile(path); err != nil {
		t.Fatal(err)
	}
	return h
}

const failsafe = 10 * time.Second // real time; only a broken watcher reaches it

// waitTimer waits until the watcher sets a timer that ok accepts, failing if it reloads first.
func (h *watchHarness) waitTimer(what string, ok func(watchTimer) bool) {
	h.t.Helper()
	deadline := time.After(failsafe)
	for {
		select {
		case tm := <-h.clk.set:
			if ok(tm) {
				return
			}
		case <-h.reloaded:
			h.t.Fatalf("the watcher put rules in force while waiting for %s: %s", what, h.inForce())
		case <-deadline:
			h.t.Fatalf("the watcher never %s", what)
		}
	}
}

// runUntilReload advances the clock through the watcher's timers until it reloads the rules.
func (h *watchHarness) runUntilReload() {
	h.t.Helper()
	deadline, start := time.After(failsafe), h.clk.now()
	for {
		select {
		case <-h.reloaded:
			return
		default:
		}
		if h.clk.now().Sub(start) > time.Minute {
			h.t.Fatalf("no reload after a minute of watcher time; in force: %s", h.inForce())
		}
		if d, ok := h.clk.earliest(); ok {
			h.clk.advance(d)
			continue
		}
		select {
		case <-h.reloaded:
			return
		case <-h.clk.set: // pending now; advance to it
		case <-deadline:
			h.t.Fatalf("the watcher stalled without reloading; in force: %s", h.inForce())
		}
	}
}

// inForce names the budgets in force with their modes.
func (h *watchHarness) inForce() string {
	var s []string
	for _, b := range h.e.Budgets() {
		s = append(s, b.Name+":"+b.Mode)
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}

// TestWatchAppliesOnlyCompleteFiles: a writer pauses mid-file for less than the watcher's window
// (2×settle), at a point where the prefix is a valid file that would turn enforce into warn. The
// prefix is never in force; the complete file is, once.
func TestWatchAppliesOnlyCompleteFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	const full = "budgets:\n  - name: gate\n    max_concurrent: 1\n    mode: enforce\n"
	prefix := full[:strings.Index(full, "    mode:")]
	if cfg, err := rules.Parse([]byte(prefix)); err != nil || cfg.Budgets[0].Mode == rules.ModeEnforce {
		t.Fatalf("the prefix must be a valid file in warn mode: %v", err)
	}
	if err := os.WriteFile(path, []byte("budgets:\n  - {name: old, mode: enforce, max_concurrent: 2}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := newWatchHarness(t, path)
	t0 := h.clk.now()

	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(prefix); err != nil {
		t.Fatal(err)
	}
	h.waitTimer("saw the write", func(tm watchTimer) bool { return true })
	h.clk.advance(settle) // quiet for settle: the first read sees the prefix
	h.waitTimer("read the prefix and settled again", func(tm watchTimer) bool { return tm.at.Equal(t0.Add(2 * settle)) })
	h.clk.advance(settle / 2) // the writer's pause, shorter than the window
	if _, err := f.WriteString(full[len(prefix):]); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	h.runUntilReload()
	if got := h.inForce(); got != "gate:enforce" {
		t.Fatalf("in force: %s; want the complete file (gate:enforce)", got)
	}
	if n := h.e.stats.Reloads.Load(); n != 2 {
		t.Fatalf("%d reloads; want 2 (the first load and the complete file)", n)
	}
}

// TestWatchRearmsWhenDirectoryIsRecreated: rm -rf of the watched directory loses its watch; once
// the directory is back with a new file, that file is in force, and later changes are seen too.
func TestWatchRearmsWhenDirectoryIsRecreated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "conf")
	path := filepath.Join(dir, "rules.yaml")
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write("budgets:\n  - {name: old, mode: enforce, max_concurrent: 2}\n")
	h := newWatchHarness(t, path)

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	h.waitTimer("noticed the directory was removed", func(tm watchTimer) bool { return tm.d == rearm })
	if got := h.inForce(); got != "old:enforce" {
		t.Fatalf("removing the directory changed the rules in force: %s", got)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write("budgets:\n  - {name: recreated, mode: enforce, max_concurrent: 1}\n")
	h.runUntilReload()
	if got := h.inForce(); got != "recreated:enforce" {
		t.Fatalf("in force: %s; want the recreated directory's file", got)
	}
	write("budgets:\n  - {name: changed, mode: warn, max_concurrent: 1}\n")
	h.runUntilReload()
	if got := h.inForce(); got != "changed:warn" {
		t.Fatalf("in force: %s; want the change after the re-armed watch", got)
	}
}
