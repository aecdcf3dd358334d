package runtime

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/pgtraffic/pgtraffic/driver/rules"
)

// WatchFile loads the rules file at path and keeps watching it: a valid change is in force
// within a second, an invalid one is logged and counted and the last good rules stay.
//
// It watches, with inotify, every directory where a change to the file can happen (see
// resolve): the file's directory, so that editors' atomic renames and Kubernetes ConfigMap
// updates (a symlink swap of "..data") are seen; when path is a symlink, the directory of each
// link on the way and of the file it reaches (/etc/app/rules.yaml -> /etc/alternatives/rules
// -> /srv/v1/rules.yaml), so that the file is seen edited or replaced there and a link seen
// re-pointed; and the directory holding each of the directory's ancestors that is a symlink
// (current -> releases/v1), so that a deploy's swap of it is seen. Some changes raise no event
// on any of these (a parent directory renamed away: mv app app.old; mv app.new app; a
// directory removed and re-created; events the kernel dropped when its queue overflowed), so
// every poll the watcher also checks what path resolves to (see fileState) and, when that
// changed since its last read, reads the file again. Each read first watches the directories
// again if what path resolves to changed.
//
// Only a complete file is applied: after the last event the watcher waits settle with no
// further event and reads the file, then waits settle again and reads it once more, and applies
// the content only if both reads agree and it parses (the first load reads once). So a writer
// that pauses for less than 2×settle mid-file never has a prefix applied; one that pauses
// longer should write elsewhere and rename the file into place, which is atomic. Content equal
// to the last attempt's is neither applied nor logged again. Its timers come from the engine's
// clock ([Options.After]).
//
// Without inotify (the user's instances or watches, shared by every process of the user on the
// machine, used up) it says so and polls alone: every change is seen, within poll + 2×settle.
//
// Only a regular file of at most maxSize bytes is read (see readRulesFile); maxSize <= 0 means
// [rules.DefaultMaxFileSize].
func (r *Runtime) WatchFile(path string, maxSize int64) error {
	if maxSize <= 0 {
		maxSize = rules.DefaultMaxFileSize
	}
	path = filepath.Clean(path)
	fw, err := newINotify()
	if err != nil {
		// The user's inotify instances are used up (fs.inotify.max_user_instances, shared by
		// every process of the user on the machine): polling alone sees every change, only
		// later (see poll).
		r.log.Warn("pgtraffic: rules file not watched; its changes are seen by polling", "path", path, "error", err)
		fw = nil
	}
	w := &watcher{fw: fw, path: path, dir: filepath.Dir(path), limit: maxSize, after: r.after,
		stop: make(chan struct{}), done: make(chan struct{}), watches: map[string]fileID{}}
	// The directories are watched before the file is first read, so that a change made while
	// the first load parses and compiles it is seen: its events wait for run. A directory not
	// watched (fs.inotify.max_user_watches used up) is seen by polling.
	if err := w.rearm(); err != nil {
		r.log.Warn("pgtraffic: rules file directory not watched; its changes are seen by polling", "path", path, "error", err)
	}
	w.seen = stateOf(path)
	data, err := readRulesFile(path, maxSize)
	if err == nil {
		var cfg *rules.Config
		if cfg, err = rules.Parse(data); err == nil {
			w.gen, err = r.setConfig(cfg)
		}
		if err != nil {
			err = &fileError{path: path, err: err}
		}
	}
	if err != nil {
		w.closeWatches()
		return err
	}
	w.last = sha256.Sum256(data)
	if err := r.setWatcher(w); err != nil {
		w.closeWatches()
		return err
	}
	go w.run(r)
	return nil
}

// newINotify makes the inotify watcher of a WatchFile (a variable for the tests of polling
// alone).
var newINotify = fsnotify.NewWatcher

// watcher is the goroutine behind WatchFile. Only run touches its state after WatchFile starts
// it; close stops it and waits for it.
type watcher struct {
	fw    *fsnotify.Watcher // nil when inotify could not be had: polling alone sees changes
	path  string
	dir   string // filepath.Dir(path), as fsnotify names events on the directory itself
	limit int64  // the largest file read, in bytes
	after func(time.Duration) <-chan time.Time
	stop  chan struct{} // closed by close: run returns
	done  chan struct{} // closed by run when it returns
	once  sync.Once

	// last is the hash of the last reload attempt's content: a hash, so that a rejected file
	// keeps none of its bytes.
	last [sha256.Size]byte
	// gen is the generation of the rules the file last put in force (Runtime.setConfig): while
	// they are in force, content equal to last is not read again; once SetConfig put others in
	// force, the file's content is applied again at its next change, be it the same.
	gen uint64
	// fileLost is set while the file is missing, so that its going and its return are logged
	// once.
	fileLost bool
	// seen is what path resolved to at the last read (taken just before it): when it resolves
	// to something else, a poll reads the file again, and the read watches the directories
	// again first.
	seen fileState
	// names are the names an event concerning the rules file can carry (see resolve): events
	// naming other files of the watched directories (an application's log beside its rules)
	// are ignored.
	names map[string]bool
	// watches are the directories watched, each with the identity of the directory its watch
	// was set on: inotify watches a directory, not its name (see arm).
	watches map[string]fileID
	// dirLost is set while dir is gone, so that its going and its return are logged once.
	dirLost bool
}

// fileID identifies a file on its machine: its device and inode numbers.
type fileID struct{ dev, ino uint64 }

// fileState is what the rules file's path resolves to at one moment: the links on the way, and
// the identity, size, modification time and permissions of the file reached. Any change to the
// file that matters changes it (a rename into place gives another inode, an edit another size
// or mtime, a chmod that makes a version that arrived unreadable readable another mode), for a
// few stat calls. The zero value, but for links, is a path that reaches no file.
type fileState struct {
	links string // the chain of names from path to the file (see hops), NUL-separated
	id    fileID
	size  int64
	mtime int64 // ns since the epoch
	mode  fs.FileMode
}

// stateOf is what path resolves to now.
func stateOf(path string) fileState {
	s := fileState{links: strings.Join(hops(path), "\x00")}
	if fi, err := os.Stat(path); err == nil {
		s.id, s.size, s.mtime, s.mode = idOf(fi), fi.Size(), fi.ModTime().UnixNano(), fi.Mode()
	}
	return s
}

// hops returns path and each name its links lead to in turn, each made absolute against the
// link's directory when it is relative: etc/app/rules.yaml, etc/alternatives/rules,
// srv/v1/rules.yaml. The last is not a link, or one whose target cannot be read.
func hops(path string) []string {
	names := []string{path}
	for cur := path; len(names) <= maxLinks; {
		t, err := os.Readlink(cur)
		if err != nil {
			break // not a link, or gone
		}
		if !filepath.IsAbs(t) {
			t = filepath.Join(filepath.Dir(cur), t)
		}
		cur = filepath.Clean(t)
		names = append(names, cur)
	}
	return names
}

// maxLinks bounds the links followed from path, as the kernel bounds a path's.
const maxLinks = 40

// rearm works out again where the file is (resolve) and watches the directories that says.
// It is called before the first read, after an event that may have changed what path resolves
// to, after lost events, and before a read that finds it changed.
func (w *watcher) rearm() error {
	dirs, names := w.resolve()
	w.names = names
	return w.arm(dirs)
}

// resolve returns the directories to watch for changes to the file path resolves to, in
// order: path's own directory (an editor's rename, a ConfigMap's "..data" swap); the directory
// of each name path leads through and of the file it reaches (/srv/conf/rules.yaml is edited
// there; update-alternatives re-points /etc/alternatives/rules there); and the directory
// holding each of dir's ancestors that is a symlink (current -> releases/v1 is swapped there).
// It also returns the names an event concerning the file can carry: each of those names and
// of their ancestors, and the file's real path and its ancestors.
func (w *watcher) resolve() (dirs []string, names map[string]bool) {
	names = map[string]bool{}
	note := func(p string) {
		for p = filepath.Clean(p); !names[p]; p = filepath.Dir(p) {
			names[p] = true
		}
	}
	dirs = []string{w.dir}
	for _, h := range hops(w.path) {
		note(h)
		dirs = append(dirs, filepath.Dir(h))
	}
	if real, err := filepath.EvalSymlinks(w.path); err == nil {
		note(real)
		dirs = append(dirs, filepath.Dir(real))
	}
	for a := w.dir; filepath.Dir(a) != a; a = filepath.Dir(a) {
		if fi, err := os.Lstat(a); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			dirs = append(dirs, filepath.Dir(a))
		}
	}
	return dirs, names
}

// arm watches each of dirs that exists now, once per directory: two names of one directory
// would share one inotify watch, which removing either would remove. It stops watching the
// others, and watches again a name that now leads to another directory than its watch's (the
// directory re-created, or renamed away with a parent: mv app app.old): inotify watches a
// directory, not a name. A directory that does not exist is not an error: a poll finds it back.
func (w *watcher) arm(dirs []string) error {
	want := make(map[string]fileID, len(dirs))
	taken := make(map[fileID]bool, len(dirs))
	for _, d := range dirs {
		fi, err := os.Stat(d)
		if err != nil || !fi.IsDir() {
			continue
		}
		if id := idOf(fi); !taken[id] {
			taken[id], want[d] = true, id
		}
	}
	for d, id := range w.watches {
		if got, ok := want[d]; !ok || got != id {
			w.unwatch(d)
		}
	}
	var errs []error
	for d, id := range want {
		if _, ok := w.watches[d]; ok || w.fw == nil {
			continue
		}
		if err := w.fw.Add(d); err == nil {
			w.watches[d] = id
		} else if !errors.Is(err, fs.ErrNotExist) { // gone since its stat: a poll finds it back
			errs = append(errs, fmt.Errorf("pgtraffic: watching rules file directory %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// unwatch stops watching d, if it is watched.
func (w *watcher) unwatch(d string) {
	w.fw.Remove(d) // an error means its watch is gone already
	delete(w.watches, d)
}

func (w *watcher) close() error {
	var err error
	w.once.Do(func() {
		close(w.stop)
		err = w.closeWatches()
		<-w.done
	})
	return err
}

// closeWatches releases the inotify instance, if w has one.
func (w *watcher) closeWatches() error {
	if w.fw == nil {
		return nil
	}
	return w.fw.Close()
}

// events and errors are the inotify watcher's channels; nil (never ready) without one.
func (w *watcher) events() (chan fsnotify.Event, chan error) {
	if w.fw == nil {
		return nil, nil
	}
	return w.fw.Events, w.fw.Errors
}

const (
	// settle is the quiet time before each of the two reads that must agree (see WatchFile).
	settle = 300 * time.Millisecond
	// poll is how often the watcher checks what path resolves to, for the changes no event
	// reports (see WatchFile): a few stat calls. A change is in force within poll + 2×settle,
	// the promised second, even so.
	poll = 250 * time.Millisecond
)

func (w *watcher) run(r *Runtime) {
	defer close(w.done)
	var (
		timer <-chan time.Time  // the pending read's settle timer; nil when no read is pending
		tick  = w.after(poll)   // the next poll
		read1 bool              // the first of the two reads is done
		first [sha256.Size]byte // its content's hash
	)
	reread := func() { read1, timer = false, w.after(settle) }
	events, errs := w.events()
	for {
		select {
		case <-w.stop:
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			name := filepath.Clean(ev.Name)
			if !w.names[name] {
				continue // another file of a watched directory
			}
			if _, ok := w.watches[name]; ok && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				// A watched directory was removed or renamed: its watch is gone, or follows it
				// elsewhere, and a directory made in its place may reuse its inode number, which
				// arm would take for the watched one.
				w.unwatch(name)
			}
			if ev.Has(fsnotify.Create | fsnotify.Remove | fsnotify.Rename) {
				w.rewatch(r) // a name on the way moved: the file may be elsewhere now
			}
			reread()
		case err, ok := <-errs:
			if !ok {
				return
			}
			if !errors.Is(err, fsnotify.ErrEventOverflow) {
				r.log.Error("pgtraffic: rules file watcher", "path", w.path, "error", err)
				continue
			}
			// The kernel dropped events, perhaps the file's: watch afresh and read it.
			r.log.Warn("pgtraffic: rules file watcher lost events; reading the file again", "path", w.path)
			for d := range w.watches {
				w.unwatch(d)
			}
			w.rewatch(r)
			reread()
		case <-tick:
			tick = w.after(poll)
			if timer == nil && stateOf(w.path) != w.seen {
				reread()
			}
		case <-timer:
			timer = nil
			// What path resolves to now is watched before it is read: a change after the read
			// raises an event, one before it is read.
			if st := stateOf(w.path); st != w.seen {
				w.seen = st
				w.rewatch(r)
			}
			data, ok := w.read(r)
			if !ok {
				read1 = false
				continue
			}
			if sum := sha256.Sum256(data); !read1 || sum != first {
				read1, first = true, sum // the first read, or changed since it: settle again
				timer = w.after(settle)
				continue
			}
			read1 = false
			w.apply(r, data)
		}
	}
}

// rewatch is rearm within run: it logs a directory it could not watch (WatchFile returns the
// error instead), and dir going away and coming back.
func (w *watcher) rewatch(r *Runtime) {
	if err := w.rearm(); err != nil {
		r.log.Warn("pgtraffic: rules file directory not watched; its changes are seen by polling", "path", w.path, "error", err)
	}
	_, err := os.Stat(w.dir)
	switch gone := errors.Is(err, fs.ErrNotExist); {
	case gone && !w.dirLost:
		w.dirLost = true
		r.log.Warn("pgtraffic: rules file directory removed; keeping the last good rules until it is back", "path", w.path)
	case !gone && w.dirLost:
		w.dirLost = false
		r.log.Info("pgtraffic: rules file directory is back; watching it again", "path", w.path)
	}
}

// read returns the file's content; false if it cannot be read now, which is logged and counted
// as a reload failure. A missing file (removed, or a swap's link left dangling: the next event or
// poll reads it again) is logged and counted once, when it is found missing after the settle
// time, and logged again when it is back.
func (w *watcher) read(r *Runtime) ([]byte, bool) {
	data, err := readRulesFile(w.path, w.limit)
	switch missing := errors.Is(err, fs.ErrNotExist); {
	case missing && !w.fileLost:
		w.fileLost = true
		r.e.Stats().ReloadFailures.Add(1)
		r.log.Warn("pgtraffic: rules file missing; keeping the last good rules until it is back", "path", w.path)
	case err == nil && w.fileLost:
		w.fileLost = false
		r.log.Info("pgtraffic: rules file is back", "path", w.path)
	}
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			r.e.Stats().ReloadFailures.Add(1)
			r.log.Error("pgtraffic: rules file unreadable; keeping the last good rules", "path", w.path, "error", err)
		}
		return nil, false
	}
	return data, true
}

// apply puts data in force if it differs from the last attempt, or the rules in force are no
// longer the file's (SetConfig), and is valid.
func (w *watcher) apply(r *Runtime, data []byte) {
	sum := sha256.Sum256(data)
	if sum == w.last && r.inForce(w.gen) {
		return
	}
	w.last = sum
	cfg, err := rules.Parse(data)
	if err == nil {
		var gen uint64
		if gen, err = r.setConfig(cfg); err == nil {
			w.gen = gen
		}
	}
	if err != nil {
		r.e.Stats().ReloadFailures.Add(1)
		r.log.Error("pgtraffic: invalid rules file; keeping the last good rules", "path", w.path, "error", err)
		return
	}
	r.log.Info("pgtraffic: rules reloaded", "path", w.path, "budgets", len(cfg.Budgets), "rules", len(cfg.Rules))
}

// fileError is err, a problem of the rules file at path, its message prefixed once: "pgtraffic:
// rules file /etc/app/rules.yaml: rules line 7: budgets[1].max_concurent: unknown field".
type fileError struct {
	path string
	err  error
}

func (e *fileError) Error() string {
	return "pgtraffic: rules file " + e.path + ": " + strings.TrimPrefix(e.err.Error(), "pgtraffic: ")
}

func (e *fileError) Unwrap() error { return e.err }

// readRulesFile reads the rules file at path, if it is a regular file (a symlink is followed
// and its target checked) of at most limit bytes. Anything else is refused before a byte of it
// is read: a FIFO would block the reader until a writer came, a device (/dev/zero) never ends,
// and a huge file would cost its size in memory. The file is opened without blocking, and the
// opened file is checked again, in case another was swapped in between.
func readRulesFile(path string, limit int64) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("pgtraffic: rules file: %w", err)
	}
	if err := checkRulesFile(path, fi, limit); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("pgtraffic: rules file: %w", err)
	}
	defer f.Close()
	if fi, err = f.Stat(); err != nil {
		return nil, fmt.Errorf("pgtraffic: rules file: %w", err)
	}
	if err := checkRulesFile(path, fi, limit); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("pgtraffic: rules file: %w", err)
	}
	if int64(len(data)) > limit { // it grew while read
		return nil, fmt.Errorf("pgtraffic: rules file %s: larger than the limit of %d bytes", path, limit)
	}
	return data, nil
}

// checkRulesFile says why the file fi, found at path, is not read as a rules file, or nil.
func checkRulesFile(path string, fi fs.FileInfo, limit int64) error {
	switch {
	case !fi.Mode().IsRegular():
		return fmt.Errorf("pgtraffic: rules file %s: not a regular file (%s)", path, fileKind(fi.Mode()))
	case fi.Size() > limit:
		return fmt.Errorf("pgtraffic: rules file %s: %d bytes, larger than the limit of %d bytes", path, fi.Size(), limit)
	}
	return nil
}

// fileKind names the type of a file that is not regular.
func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "type " + m.Type().String()
}
