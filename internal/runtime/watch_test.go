package runtime

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/engine"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
)

// reloadLog is a slog handler that reports each "rules reloaded" record on a channel, and the
// text of each error record on another, and of each warning on a third, when they have room.
type reloadLog struct {
	reloaded chan struct{}
	failed   chan string
	warned   chan string
}

func (h reloadLog) Enabled(context.Context, slog.Level) bool { return true }
func (h reloadLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h reloadLog) WithGroup(string) slog.Handler            { return h }
func (h reloadLog) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "rules reloaded") {
		h.reloaded <- struct{}{}
	}
	to := map[slog.Level]chan string{slog.LevelError: h.failed, slog.LevelWarn: h.warned}[r.Level]
	if to == nil {
		return nil
	}
	text := r.Message
	r.Attrs(func(a slog.Attr) bool { text += " " + a.String(); return true })
	select {
	case to <- text:
	default:
	}
	return nil
}

// watchHarness is a runtime watching path with a fake clock.
type watchHarness struct {
	t        *testing.T
	r        *Runtime
	clk      *fakeclock.Clock
	reloaded chan struct{}
	failed   chan string // error logs
	warned   chan string // warnings
}

func newWatchHarness(t *testing.T, path string) *watchHarness {
	t.Helper()
	h := newWatchRuntime(t)
	if err := h.r.WatchFile(path, 0); err != nil {
		t.Fatal(err)
	}
	return h
}

// newWatchRuntime is a harness that watches nothing yet.
func newWatchRuntime(t *testing.T) *watchHarness {
	t.Helper()
	h := &watchHarness{t: t, reloaded: make(chan struct{}, 100), failed: make(chan string, 100), warned: make(chan string, 100)}
	h.r, h.clk = newRuntime(t, "", func(o *engine.Options) { o.Logger = slog.New(reloadLog{h.reloaded, h.failed, h.warned}) })
	return h
}

const failsafe = 10 * time.Second // real time; only a broken watcher reaches it

// waitTimer waits until the watcher sets a timer that ok accepts, failing if it reloads first.
// The polls' timers are not offered to ok: they come whatever happens.
func (h *watchHarness) waitTimer(what string, ok func(fakeclock.Timer) bool) {
	h.t.Helper()
	deadline := time.After(failsafe)
	for {
		select {
		case tm := <-h.clk.Set():
			if tm.D != poll && ok(tm) {
				return
			}
		case <-h.reloaded:
			h.t.Fatalf("the watcher put rules in force while waiting for %s: %s", what, h.inForce())
		case <-deadline:
			h.t.Fatalf("the watcher never %s", what)
		}
	}
}

// waitWarning waits until the watcher logs a warning that contains text, failing if it reloads
// first.
func (h *watchHarness) waitWarning(what, text string) {
	h.t.Helper()
	deadline := time.After(failsafe)
	for {
		select {
		case got := <-h.warned:
			if strings.Contains(got, text) {
				return
			}
		case <-h.reloaded:
			h.t.Fatalf("the watcher put rules in force while waiting until it %s: %s", what, h.inForce())
		case <-deadline:
			h.t.Fatalf("the watcher never %s", what)
		}
	}
}

// runUntilReload advances the clock through the watcher's timers until it reloads the rules.
func (h *watchHarness) runUntilReload() {
	h.t.Helper()
	deadline, start := time.After(failsafe), h.clk.Now()
	for {
		select {
		case <-h.reloaded:
			return
		default:
		}
		if h.clk.Now().Sub(start) > time.Minute {
			h.t.Fatalf("no reload after a minute of watcher time; in force: %s", h.inForce())
		}
		if d, ok := h.clk.Earliest(); ok {
			h.clk.Advance(d)
			continue
		}
		select {
		case <-h.reloaded:
			return
		case <-h.clk.Set(): // pending now; advance to it
		case <-deadline:
			h.t.Fatalf("the watcher stalled without reloading; in force: %s", h.inForce())
		}
	}
}

// inForce names the budgets in force with their modes.
func (h *watchHarness) inForce() string {
	var s []string
	for _, b := range h.r.e.Budgets() {
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
	t0 := h.clk.Now()

	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(prefix); err != nil {
		t.Fatal(err)
	}
	h.waitTimer("saw the write", func(tm fakeclock.Timer) bool { return true })
	h.clk.Advance(settle) // quiet for settle: the first read sees the prefix
	h.waitTimer("read the prefix and settled again", func(tm fakeclock.Timer) bool { return tm.At.Equal(t0.Add(2 * settle)) })
	h.clk.Advance(settle / 2) // the writer's pause, shorter than the window
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
	if n := h.r.e.Stats().Reloads.Load(); n != 2 {
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
	h.waitWarning("noticed the directory was removed", "directory removed")
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

// runUntilFailure advances the clock through the watcher's timers until it logs an error, and
// returns the error's text.
func (h *watchHarness) runUntilFailure() string {
	h.t.Helper()
	deadline, start := time.After(failsafe), h.clk.Now()
	for {
		select {
		case text := <-h.failed:
			return text
		case <-h.reloaded:
			h.t.Fatalf("the watcher put rules in force: %s", h.inForce())
		default:
		}
		if h.clk.Now().Sub(start) > time.Minute {
			h.t.Fatalf("no error after a minute of watcher time")
		}
		if d, ok := h.clk.Earliest(); ok {
			h.clk.Advance(d)
			continue
		}
		select {
		case text := <-h.failed:
			return text
		case <-h.clk.Set():
		case <-deadline:
			h.t.Fatalf("the watcher stalled without an error (blocked reading the file?)")
		}
	}
}

// closeWithin closes the engine, failing the test rather than hanging if Close blocks.
func (h *watchHarness) closeWithin(d time.Duration) {
	h.t.Helper()
	done := make(chan struct{})
	go func() { h.r.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		h.t.Fatalf("Close did not return within %v", d)
	}
}

// unblockFIFO opens the FIFO at path for writing and closes it, so that a reader blocked in
// opening it returns (reading end of file): the cleanup of a test that fails on a watcher that
// blocks on FIFOs.
func unblockFIFO(path string) {
	if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
		f.Close()
	}
}

// nonRegularFiles makes, in dir, each kind of file the watcher must refuse unread: a FIFO (a
// blocking read), a symlink to /dev/zero (an endless one) and a file over the size limit.
func nonRegularFiles(t *testing.T, dir string, limit int64) map[string]string {
	t.Helper()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unblockFIFO(fifo) })
	zero := filepath.Join(dir, "zero")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	// A valid file but for its size: a budget, then blanks to one byte over the limit.
	content := []byte("budgets:\n  - {name: big, mode: warn}\n")
	content = append(content, bytes.Repeat([]byte{' '}, int(limit)+1-len(content))...)
	if err := os.WriteFile(big, content, 0o644); err != nil {
		t.Fatal(err)
	}
	return map[string]string{"fifo": fifo, "symlink to /dev/zero": zero, "over the size limit": big}
}

// TestWatchFileRefusesNonRegularFiles: the first load of a FIFO, of a symlink to /dev/zero and
// of a file over the limit fails at once, naming the problem, instead of blocking, reading
// forever or reading the whole file.
func TestWatchFileRefusesNonRegularFiles(t *testing.T) {
	const limit = 1 << 20
	files := nonRegularFiles(t, t.TempDir(), limit)
	for name, want := range map[string]string{
		"fifo":                 "not a regular file (a named pipe)",
		"symlink to /dev/zero": "not a regular file (a device)",
		"over the size limit":  "1048577 bytes, larger than the limit of 1048576 bytes",
	} {
		t.Run(name, func(t *testing.T) {
			h := newWatchRuntime(t)
			done := make(chan error, 1)
			go func() { done <- h.r.WatchFile(files[name], limit) }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("WatchFile: %v; want an error saying %q", err, want)
				}
			case <-time.After(failsafe):
				unblockFIFO(files[name])
				t.Fatal("WatchFile did not return")
			}
			h.closeWithin(failsafe)
		})
	}
}

// TestWatchReloadRefusesNonRegularFiles: a FIFO, a symlink to /dev/zero or a file over the limit
// renamed over the rules file is refused (logged, counted) without stalling the watcher: the
// last good rules stay, a valid file written next is in force, and Close returns.
func TestWatchReloadRefusesNonRegularFiles(t *testing.T) {
	const limit = 1 << 20
	for _, name := range []string{"fifo", "symlink to /dev/zero", "over the size limit"} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "rules.yaml")
			if err := os.WriteFile(path, []byte("budgets:\n  - {name: old, mode: enforce, max_concurrent: 2}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			h := newWatchRuntime(t)
			if err := h.r.WatchFile(path, limit); err != nil {
				t.Fatal(err)
			}
			files := nonRegularFiles(t, t.TempDir(), limit)
			t.Cleanup(func() { unblockFIFO(path) }) // before Close: a blocked reader returns
			if err := os.Rename(files[name], path); err != nil {
				t.Fatal(err)
			}
			failed := h.runUntilFailure()
			if !strings.Contains(failed, "keeping the last good rules") {
				t.Fatalf("logged %q", failed)
			}
			if got := h.inForce(); got != "old:enforce" {
				t.Fatalf("in force: %s; want the last good rules", got)
			}
			if n := h.r.e.Stats().ReloadFailures.Load(); n == 0 {
				t.Fatal("the refused file was not counted")
			}
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte("budgets:\n  - {name: next, mode: warn}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			h.runUntilReload()
			if got := h.inForce(); got != "next:warn" {
				t.Fatalf("in force: %s; want the file written after the refused one", got)
			}
			h.closeWithin(failsafe)
		})
	}
}

// TestWatchRejectedFileKeepsNoBytes: the watcher remembers what it last tried by a hash, so a
// large invalid file costs no memory once it is rejected.
func TestWatchRejectedFileKeepsNoBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := newWatchHarness(t, path)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const size = 8 << 20
	// Invalid from its first byte, so that the parser refuses it at once.
	bad := append([]byte("\xff"), bytes.Repeat([]byte{' '}, size)...)
	if err := os.WriteFile(path, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	bad = nil
	if failed := h.runUntilFailure(); !strings.Contains(failed, "invalid rules file") {
		t.Fatalf("logged %q", failed)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > size/2 {
		t.Fatalf("the heap grew by %d bytes with the rejected %d-byte file", grew, size)
	}
}

// TestWatchFollowsSymlinkTarget: the rules file is a symlink to a file in another directory
// (/etc/app/rules.yaml -> /srv/conf/rules.yaml). That file edited in place, or replaced by a
// rename, is in force as if the link's own directory had changed; and once the link points to
// a file in a third directory, that one is watched instead. Watching only the link's directory
// saw none of the edits, and the old rules stayed in force without a word.
func TestWatchFollowsSymlinkTarget(t *testing.T) {
	linkDir, a, b := t.TempDir(), t.TempDir(), t.TempDir()
	write := func(path, content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	budget := func(name string) string {
		return "budgets:\n  - {name: " + name + ", mode: enforce, max_concurrent: 1}\n"
	}
	target, path := filepath.Join(a, "rules.yaml"), filepath.Join(linkDir, "rules.yaml")
	write(target, budget("first"))
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	h := newWatchHarness(t, path)

	write(target, budget("edited"))
	h.runUntilReload()
	if got := h.inForce(); got != "edited:enforce" {
		t.Fatalf("in force: %s; want the link's target edited in place", got)
	}
	tmp := filepath.Join(a, ".rules.tmp")
	write(tmp, budget("renamed"))
	if err := os.Rename(tmp, target); err != nil {
		t.Fatal(err)
	}
	h.runUntilReload()
	if got := h.inForce(); got != "renamed:enforce" {
		t.Fatalf("in force: %s; want the file renamed over the link's target", got)
	}

	// The link pointed at a file in a third directory: that directory is watched from then on.
	other := filepath.Join(b, "rules.yaml")
	write(other, budget("moved"))
	if err := os.Symlink(other, filepath.Join(linkDir, ".link.tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(linkDir, ".link.tmp"), path); err != nil {
		t.Fatal(err)
	}
	h.runUntilReload()
	if got := h.inForce(); got != "moved:enforce" {
		t.Fatalf("in force: %s; want the link's new target", got)
	}
	write(other, budget("moved_edited"))
	h.runUntilReload()
	if got := h.inForce(); got != "moved_edited:enforce" {
		t.Fatalf("in force: %s; want the new target edited in place", got)
	}
}

// TestPollSeesPermissionChange: where the watcher polls alone (no inotify: its instances used
// up, or a network filesystem that raises no event for another host's writes), a version of
// the rules file that arrives unreadable, and is then made readable with chmod, must look
// changed to the next poll: the read that failed left the version seen, and its identity, size
// and mtime do not change with a chmod.
func TestPollSeesPermissionChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte("budgets: []\n"), 0o000); err != nil {
		t.Fatal(err)
	}
	before := stateOf(path)
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if after := stateOf(path); after == before {
		t.Errorf("a chmod of the rules file left the polled state unchanged (%+v): a version that arrived unreadable is never read again", after)
	}
}
