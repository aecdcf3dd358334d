package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/engine"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
)

// The changes below raise no event on the directories a watcher that watches only the file's
// directory and its final target's would watch, or lose their events: each must still be in
// force within a second (of the fake clock), and the changes after it seen by their events.

// namingBudget is a rules file with one budget, name.
func namingBudget(name string) []byte {
	return []byte("budgets:\n  - {name: " + name + ", mode: enforce, max_concurrent: 1}\n")
}

// replaceFile writes content to a file beside path and renames it into place, as editors and
// deploys do.
func replaceFile(t *testing.T, path string, content []byte) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, content, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// mkdirs makes each of dirs under base.
func mkdirs(t *testing.T, base string, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// reloadsTo advances the clock until the watcher reloads, and fails unless the budget in force
// is then want's.
func (h *watchHarness) reloadsTo(what, want string) {
	h.t.Helper()
	h.runUntilReload()
	if got := h.inForce(); got != want+":enforce" {
		h.t.Fatalf("after %s: in force %s; want %s:enforce", what, got, want)
	}
}

// seenByEvent waits until the watcher sets a read's timer from the clock's time now, which
// the test has not advanced since its change: the watcher saw an event, as no poll was due.
func (h *watchHarness) seenByEvent(what string) {
	h.t.Helper()
	at := h.clk.Now().Add(settle) // not a timer of an earlier read
	h.waitTimer("saw an event after "+what, func(tm fakeclock.Timer) bool { return tm.D == settle && tm.At.Equal(at) })
}

// TestPollKeepsReloadsWithinASecond: a change that raises no event is read at the next poll
// and, the file read the same twice, applied 2×settle later: within the promised second.
func TestPollKeepsReloadsWithinASecond(t *testing.T) {
	if d := poll + 2*settle; d > time.Second {
		t.Fatalf("a change seen by a poll is in force after up to %v; the promise is a second", d)
	}
}

// watching lists the directories the watcher watches.
func (h *watchHarness) watching() []string {
	return h.r.watcher.fw.WatchList()
}

// TestReloadParentDirectorySwapped: a deploy replaces a release directory by renames (mv app
// app.old; mv app.new app), which moves the rules file's directory (app/conf) without an event
// on it: inotify watches the directory, now app.old/conf. The new release's file is in force,
// its directory watched in place of the old one, and a later edit of the file at the path
// seen.
func TestReloadParentDirectorySwapped(t *testing.T) {
	base := t.TempDir()
	app := filepath.Join(base, "app")
	path := filepath.Join(app, "conf", "rules.yaml")
	writeRelease := func(dir, budget string) {
		mkdirs(t, dir, "conf")
		if err := os.WriteFile(filepath.Join(dir, "conf", "rules.yaml"), namingBudget(budget), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeRelease(app, "v1")
	h := newWatchHarness(t, path)

	writeRelease(app+".new", "v2")
	if err := os.Rename(app, app+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(app+".new", app); err != nil {
		t.Fatal(err)
	}
	h.reloadsTo("the release directory was swapped", "v2")
	replaceFile(t, path, namingBudget("v3"))
	h.seenByEvent("the file at the path was edited")
	h.reloadsTo("the file at the path was edited", "v3")
}

// TestReloadIntermediateSymlinkRepointed: the rules file is a chain of links, as
// update-alternatives makes them: etc/app/rules.yaml -> etc/alternatives/rules ->
// srv/v1/rules.yaml. Re-pointing the middle link to srv/v2/rules.yaml (by an atomic rename of
// a new link over it) is seen, as the directory of each link of the chain is watched; then
// srv/v2 is watched instead of srv/v1.
func TestReloadIntermediateSymlinkRepointed(t *testing.T) {
	base := t.TempDir()
	mkdirs(t, base, "etc/app", "etc/alternatives", "srv/v1", "srv/v2")
	for _, v := range []string{"v1", "v2"} {
		if err := os.WriteFile(filepath.Join(base, "srv", v, "rules.yaml"), namingBudget(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	alt := filepath.Join(base, "etc/alternatives/rules")
	path := filepath.Join(base, "etc/app/rules.yaml")
	if err := os.Symlink(filepath.Join(base, "srv/v1/rules.yaml"), alt); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(alt, path); err != nil {
		t.Fatal(err)
	}
	h := newWatchHarness(t, path)
	if got := h.inForce(); got != "v1:enforce" {
		t.Fatalf("first load: in force %s", got)
	}

	tmp := alt + ".tmp"
	if err := os.Symlink(filepath.Join(base, "srv/v2/rules.yaml"), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, alt); err != nil {
		t.Fatal(err)
	}
	h.seenByEvent("the intermediate link was re-pointed")
	h.reloadsTo("the intermediate link was pointed at srv/v2", "v2")
	if w := h.watching(); !slices.Contains(w, filepath.Join(base, "srv/v2")) || slices.Contains(w, filepath.Join(base, "srv/v1")) {
		t.Fatalf("watching %v; want srv/v2 in place of srv/v1", w)
	}
	replaceFile(t, filepath.Join(base, "srv/v2/rules.yaml"), namingBudget("v2_edited"))
	h.seenByEvent("the new target was edited")
	h.reloadsTo("the new target was edited", "v2_edited")
}

// TestReloadSymlinkTargetDirectoryRecreated: the rules file is a symlink to a file in another
// directory (etc/app/rules.yaml -> srv/conf/rules.yaml), which is watched too. A deploy removes
// srv/conf and, a moment later, creates it again with a new file: etc/app sees nothing of it.
// The new file is in force, and srv/conf watched again.
func TestReloadSymlinkTargetDirectoryRecreated(t *testing.T) {
	base := t.TempDir()
	mkdirs(t, base, "etc/app", "srv/conf")
	conf := filepath.Join(base, "srv/conf")
	target := filepath.Join(conf, "rules.yaml")
	path := filepath.Join(base, "etc/app/rules.yaml")
	if err := os.WriteFile(target, namingBudget("v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	h := newWatchHarness(t, path)

	if err := os.RemoveAll(conf); err != nil {
		t.Fatal(err)
	}
	h.seenByEvent("the target directory was removed")
	h.idle(1500 * time.Millisecond) // the deploy takes a moment
	if got := h.inForce(); got != "v1:enforce" {
		t.Fatalf("removing the target directory changed the rules in force: %s", got)
	}
	mkdirs(t, base, "srv/conf")
	replaceFile(t, target, namingBudget("v2"))
	h.reloadsTo("the target directory was re-created with a new file", "v2")
	replaceFile(t, target, namingBudget("v3"))
	h.seenByEvent("the re-created target directory's file was edited")
	h.reloadsTo("the re-created target directory's file was edited", "v3")
}

// idle advances the clock by d, a poll at a time, each time until the watcher has set its next
// poll, and fails if it reloads meanwhile.
func (h *watchHarness) idle(d time.Duration) {
	h.t.Helper()
	for end := h.clk.Now().Add(d); h.clk.Now().Before(end); {
		h.clk.Advance(poll)
		h.waitPoll()
	}
}

// waitPoll waits until the watcher sets a poll's timer that is not due yet.
func (h *watchHarness) waitPoll() {
	h.t.Helper()
	deadline := time.After(failsafe)
	for {
		select {
		case tm := <-h.clk.Set():
			if tm.D == poll && tm.At.After(h.clk.Now()) {
				return
			}
		case <-h.reloaded:
			h.t.Fatalf("the watcher put rules in force while idle: %s", h.inForce())
		case <-deadline:
			h.t.Fatal("the watcher stopped polling")
		}
	}
}

// heldLog is reloadLog, but holds the watcher in its log of a reload while held is set (after
// reporting it), until release is closed.
type heldLog struct {
	reloadLog
	held    *atomic.Bool
	release chan struct{}
}

func (h heldLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h heldLog) WithGroup(string) slog.Handler      { return h }
func (h heldLog) Handle(ctx context.Context, r slog.Record) error {
	err := h.reloadLog.Handle(ctx, r)
	if strings.Contains(r.Message, "rules reloaded") && h.held.CompareAndSwap(true, false) {
		<-h.release
	}
	return err
}

// TestReloadAfterEventOverflow: inotify queues a bounded number of events
// (fs.inotify.max_queued_events); past it the kernel drops events and reports one overflow,
// which fsnotify passes on as ErrEventOverflow. Here the watcher is busy (held in its log of a
// reload, as it would be applying a large file) while its directory sees more files created
// than the queue holds (a busy directory), and the rules file is then replaced: the
// replacement's events are dropped. On the overflow the watcher reads the file again at once,
// without waiting for a poll, and the replacement is in force.
func TestReloadAfterEventOverflow(t *testing.T) {
	text, err := os.ReadFile("/proc/sys/fs/inotify/max_queued_events")
	if err != nil {
		t.Skipf("no inotify queue limit to overflow: %v", err)
	}
	queue, err := strconv.Atoi(strings.TrimSpace(string(text)))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, namingBudget("v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	var held atomic.Bool
	release := make(chan struct{})
	free := sync.OnceFunc(func() { close(release) })
	h := &watchHarness{t: t, reloaded: make(chan struct{}, 100), failed: make(chan string, 100), warned: make(chan string, 100)}
	h.r, h.clk = newRuntime(t, "", func(o *engine.Options) {
		o.Logger = slog.New(heldLog{reloadLog{h.reloaded, h.failed, h.warned}, &held, release})
	})
	t.Cleanup(free) // before the runtime's Close, which waits for the watcher
	if err := h.r.WatchFile(path, 0); err != nil {
		t.Fatal(err)
	}

	held.Store(true)
	replaceFile(t, path, namingBudget("v2"))
	h.runUntilReload() // and the watcher is held in its log of it
	// fsnotify reads up to 4096 events ahead of the watcher; then the kernel's queue fills.
	for i := range queue + 4096 + 1000 {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("other-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	replaceFile(t, path, namingBudget("v3"))
	free()
	h.seenByEvent("its events overflowed the queue")
	h.reloadsTo("the rules file was replaced and its events lost", "v3")
}

// TestWatchKeepsSharedDirectoryWatch: one directory is watched for two reasons: it holds a
// symlink on the way to the rules file's directory (app -> rel1) and the file the rules file
// links to (rel1/rules.yaml -> ../shared.yaml). When the rules file is pointed at a file of its
// own directory, the directory holding the link is still watched, and the link's swap to
// another release is seen by its event.
func TestWatchKeepsSharedDirectoryWatch(t *testing.T) {
	root := t.TempDir()
	mkdirs(t, root, "rel1", "rel2")
	if err := os.WriteFile(filepath.Join(root, "shared.yaml"), namingBudget("shared"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"rel1", "rel2"} {
		if err := os.WriteFile(filepath.Join(root, r, "own.yaml"), namingBudget(r), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join("..", "shared.yaml"), filepath.Join(root, "rel1", "rules.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("own.yaml", filepath.Join(root, "rel2", "rules.yaml")); err != nil {
		t.Fatal(err)
	}
	app := filepath.Join(root, "app")
	if err := os.Symlink("rel1", app); err != nil {
		t.Fatal(err)
	}
	h := newWatchHarness(t, filepath.Join(app, "rules.yaml"))
	if got := h.inForce(); got != "shared:enforce" {
		t.Fatalf("first load: in force %s", got)
	}

	link := filepath.Join(root, "rel1", "rules.yaml")
	if err := os.Symlink("own.yaml", link+".tmp"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(link+".tmp", link); err != nil {
		t.Fatal(err)
	}
	h.reloadsTo("the rules file was pointed at a file of its own directory", "rel1")
	if err := os.Symlink("rel2", app+".tmp"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(app+".tmp", app); err != nil { // ln -sfn, atomically
		t.Fatal(err)
	}
	h.seenByEvent("the release link was swapped")
	h.reloadsTo("the release link was swapped", "rel2")
}

// TestWatchDoesNotReapplyUnchangedFile: a file replaced by one with the same content, or
// touched, is read again (it is another file, or changed, for all the watcher knows) and not
// applied or logged again: the rules in force keep their reload count.
func TestWatchDoesNotReapplyUnchangedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, namingBudget("same"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := newWatchHarness(t, path)
	replaceFile(t, path, namingBudget("same"))
	h.seenByEvent("the file was replaced")
	h.idle(2 * time.Second)
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	h.seenByEvent("the file was touched")
	h.idle(2 * time.Second)
	if n := h.r.e.Stats().Reloads.Load(); n != 1 {
		t.Fatalf("%d reloads; want 1 (the first load)", n)
	}
}

// TestWatchReappliesFileAfterSetConfig: rules put in force by SetConfig (an emergency gate from
// code) replace the file's; the file rewritten with its same content (a ConfigMap applied
// again) puts the file's rules back in force.
func TestWatchReappliesFileAfterSetConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, namingBudget("file"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := newWatchHarness(t, path)
	gate, err := rules.Parse(namingBudget("gate"))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.r.SetConfig(gate); err != nil {
		t.Fatal(err)
	}
	if got := h.inForce(); got != "gate:enforce" {
		t.Fatalf("in force after SetConfig: %s", got)
	}
	replaceFile(t, path, namingBudget("file"))
	h.seenByEvent("the file was rewritten with its content")
	h.reloadsTo("the file was rewritten with its content", "file")
}

// TestWatchWarnsWhenFileMissing: a rules file removed (or a ConfigMap version without it) keeps
// the last good rules, and says so once, not at every poll, and counts it once as a reload
// failure (the status and the metrics show it, not only the log); its return is said and
// applied.
func TestWatchWarnsWhenFileMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, namingBudget("before"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := newWatchHarness(t, path)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	h.seenByEvent("the file was removed")
	h.clk.Advance(settle)
	h.waitWarning("warned that the file is missing", "rules file missing")
	h.idle(2 * time.Second)
	select {
	case w := <-h.warned:
		t.Fatalf("a second warning while the file stays missing: %s", w)
	default:
	}
	if got := h.inForce(); got != "before:enforce" {
		t.Fatalf("in force while the file is missing: %s; want the last good rules", got)
	}
	if n := h.r.e.Stats().ReloadFailures.Load(); n != 1 {
		t.Errorf("reload failures while the file is missing: %d, want 1", n)
	}
	replaceFile(t, path, namingBudget("after"))
	h.reloadsTo("the file is back", "after")
}

// TestWatchPollsWithoutINotify: with the user's inotify instances used up (shared by every
// process of the user on the machine), WatchFile still loads the file, says that it polls, and
// a change is in force as the poll finds it.
func TestWatchPollsWithoutINotify(t *testing.T) {
	saved := newINotify
	t.Cleanup(func() { newINotify = saved })
	newINotify = func() (*fsnotify.Watcher, error) { return nil, syscall.EMFILE }
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, namingBudget("before"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := newWatchRuntime(t)
	if err := h.r.WatchFile(path, 0); err != nil {
		t.Fatalf("WatchFile without inotify: %v; want polling", err)
	}
	select {
	case w := <-h.warned:
		if !strings.Contains(w, "polling") {
			t.Fatalf("warning %q; want one saying the file is polled", w)
		}
	default:
		t.Fatal("no warning that the rules file is polled")
	}
	replaceFile(t, path, namingBudget("after"))
	h.reloadsTo("the file was replaced", "after")
}
