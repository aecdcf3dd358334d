package runtime

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/pgtraffic/pgtraffic/driver/rules"
)

// WatchFile loads the rules file at path and keeps watching it: a valid change is in force
// within a second, an invalid one is logged and counted and the last good rules stay. It
// watches the file's directory, so that editors' atomic renames and Kubernetes ConfigMap
// updates (a symlink swap of "..data") are seen; and when path is a symlink to a file in
// another directory, that directory too, so that the file it points to is seen edited or
// replaced there (see follow).
//
// Only a complete file is applied: after the last event the watcher waits settle with no
// further event and reads the file, then waits settle again and reads it once more, and applies
// the content only if both reads agree and it parses (the first load reads once). So a writer
// that pauses for less than 2×settle mid-file never has a prefix applied; one that pauses
// longer should write elsewhere and rename the file into place, which is atomic. If the
// directory itself goes away, the watcher tries to watch it again every rearm and then reloads
// by the same rule. Its timers come from the engine's clock ([Options.After]).
//
// Only a regular file of at most maxSize bytes is read (see readRulesFile); maxSize <= 0 means
// [rules.DefaultMaxFileSize].
func (r *Runtime) WatchFile(path string, maxSize int64) error {
	if maxSize <= 0 {
		maxSize = rules.DefaultMaxFileSize
	}
	// The directory is watched before the file is first read, so that a change made while the
	// first load parses and compiles it is seen: its events wait for run.
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("pgtraffic: watching rules file: %w", err)
	}
	dir := filepath.Dir(path)
	if err := fw.Add(dir); err != nil {
		fw.Close()
		return fmt.Errorf("pgtraffic: watching rules file: %w", err)
	}
	w := &watcher{fw: fw, path: filepath.Clean(path), dir: dir, limit: maxSize, after: r.after, done: make(chan struct{})}
	w.follow()
	data, err := readRulesFile(path, maxSize)
	if err == nil {
		var cfg *rules.Config
		if cfg, err = rules.Parse(data); err == nil {
			err = r.SetConfig(cfg)
		}
		if err != nil {
			err = fmt.Errorf("pgtraffic: rules file %s: %w", path, err)
		}
	}
	if err != nil {
		fw.Close()
		return err
	}
	w.last = sha256.Sum256(data)
	if err := r.setWatcher(w); err != nil {
		fw.Close()
		return err
	}
	go w.run(r)
	return nil
}

// watcher is the goroutine behind WatchFile. Only run touches its state after WatchFile starts
// it; close stops it and waits for it.
type watcher struct {
	fw    *fsnotify.Watcher
	path  string
	dir   string // filepath.Dir(path), as fsnotify names events on the directory itself
	limit int64  // the largest file read, in bytes
	after func(time.Duration) <-chan time.Time
	done  chan struct{}
	once  sync.Once

	// last is the hash of the last reload attempt's content: a hash, so that a rejected file
	// keeps none of its bytes.
	last [sha256.Size]byte
	// target is the directory of the file path resolves to, watched too when path is a symlink
	// into another directory (see follow); "" when none is.
	target string
	// names are the names an event concerning the rules file can carry (see follow): events
	// naming other files of the watched directories (an application's log beside its rules)
	// are ignored.
	names map[string]bool
	// links are dir's ancestors that are symlinks (dir included), each watched in its own
	// directory (linkDirs): when a deploy points one elsewhere (current -> releases/v2), dir
	// is another directory, watched again.
	links    map[string]bool
	linkDirs []string
}

// follow watches the directory of the file that path resolves to, when that is not dir: a
// rules file that is a symlink to a file elsewhere (/etc/app/rules.yaml ->
// /srv/conf/rules.yaml) is edited, or renamed into place, there, and dir sees nothing of it.
// It also notes the names an event about the file can carry (names), and watches the
// directories of dir's symlinked ancestors (links). It is called after each read, as a link
// may have been pointed elsewhere since; a path that does not resolve now keeps the directory
// watched, where the file may come back.
func (w *watcher) follow() {
	w.noteNames()
	w.watchLinks()
	real, err := filepath.EvalSymlinks(w.path)
	if err != nil {
		return
	}
	dir := filepath.Dir(real)
	if d, err := filepath.EvalSymlinks(w.dir); err == nil && d == dir {
		dir = "" // path is in dir itself, perhaps under another name
	}
	if dir == w.target {
		return
	}
	w.unfollow()
	if dir != "" && w.fw.Add(dir) == nil {
		w.target = dir
	}
}

// noteNames notes the names an event concerning the rules file can carry: path, each link on
// the way from it to the file and what the link points to, the file itself, and the
// directories of each (a ConfigMap's update renames its "..data" link; an editor replaces the
// file by rename).
func (w *watcher) noteNames() {
	names := map[string]bool{}
	add := func(p string) {
		for p = filepath.Clean(p); !names[p]; p = filepath.Dir(p) {
			names[p] = true
		}
	}
	cur := w.path
	for range maxLinks {
		add(cur)
		t, err := os.Readlink(cur)
		if err != nil {
			break // not a link, or gone
		}
		if !filepath.IsAbs(t) {
			t = filepath.Join(filepath.Dir(cur), t)
		}
		cur = t
	}
	if real, err := filepath.EvalSymlinks(w.path); err == nil {
		add(real)
	}
	w.names = names
}

// maxLinks bounds the links followed from path, as the kernel bounds a path's.
const maxLinks = 40

// watchLinks watches the directory of each of dir's ancestors that is a symlink (dir
// included), where a deploy swaps it, and stops watching those that no longer are.
func (w *watcher) watchLinks() {
	links := map[string]bool{}
	var dirs []string
	for a := filepath.Clean(w.dir); ; a = filepath.Dir(a) {
		if fi, err := os.Lstat(a); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			links[a] = true
			dirs = append(dirs, filepath.Dir(a))
		}
		if filepath.Dir(a) == a {
			break
		}
	}
	for _, d := range w.linkDirs {
		if !slices.Contains(dirs, d) {
			w.fw.Remove(d) // an error means its watch is gone already
		}
	}
	for i := 0; i < len(dirs); i++ {
		if !slices.Contains(w.linkDirs, dirs[i]) && w.fw.Add(dirs[i]) != nil {
			dirs = slices.Delete(dirs, i, i+1)
			i--
		}
	}
	w.links, w.linkDirs = links, dirs
}

// unfollow stops watching the symlink's target directory, if one is watched.
func (w *watcher) unfollow() {
	if w.target != "" {
		w.fw.Remove(w.target) // an error means its watch is gone already
		w.target = ""
	}
}

func (w *watcher) close() error {
	var err error
	w.once.Do(func() {
		err = w.fw.Close()
		<-w.done
	})
	return err
}

const (
	// settle is the quiet time before each of the two reads that must agree (see WatchFile):
	// 2×settle, the reload's delay, stays within the promised second.
	settle = 300 * time.Millisecond
	// rearm is how often the watcher tries to watch a removed directory again.
	rearm = 100 * time.Millisecond
)

func (w *watcher) run(r *Runtime) {
	defer close(w.done)
	var (
		timer   <-chan time.Time  // the one pending timer: settle, or rearm when !watched
		watched = true            // the directory is watched
		read1   bool              // the first of the two reads is done
		first   [sha256.Size]byte // its content's hash
	)
	for {
		select {
		case ev, ok := <-w.fw.Events:
			if !ok {
				return
			}
			if !watched {
				continue // a late event of the lost watch; keep trying to re-arm
			}
			if ev.Name == w.dir && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				// The directory went away and its watch with it (fsnotify drops it).
				w.fw.Remove(w.dir) // in case this platform kept it; an error means it is gone
				w.unfollow()       // followed again after the next read
				watched, read1 = false, false
				timer = w.after(rearm)
				r.log.Warn("pgtraffic: rules file directory removed; keeping the last good rules until it is back", "path", w.path)
				continue
			}
			if ev.Name == w.target && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				w.unfollow() // its watch went with it; followed again after the next read
			}
			name := filepath.Clean(ev.Name)
			if w.links[name] {
				// A link on the way to dir points elsewhere now: dir is another directory.
				w.fw.Remove(w.dir) // an error means its watch is gone already
				if err := w.fw.Add(w.dir); err != nil {
					watched, read1 = false, false
					timer = w.after(rearm)
					continue
				}
			} else if !w.names[name] {
				continue // another file of the directory
			}
			read1 = false
			timer = w.after(settle)
		case err, ok := <-w.fw.Errors:
			if !ok {
				return
			}
			r.log.Error("pgtraffic: rules file watcher", "path", w.path, "error", err)
		case <-timer:
			timer = nil
			if !watched {
				if err := w.fw.Add(w.dir); err != nil {
					timer = w.after(rearm)
					continue
				}
				watched = true
				r.log.Info("pgtraffic: rules file directory is back; watching it again", "path", w.path)
				timer = w.after(settle)
				continue
			}
			data, ok := w.read(r)
			if !ok {
				read1 = false
				continue
			}
			w.follow()
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

// read returns the file's content; false if it cannot be read now, which is logged and counted
// unless the file is missing (mid-swap, or removed: the next event reads it again).
func (w *watcher) read(r *Runtime) ([]byte, bool) {
	data, err := readRulesFile(w.path, w.limit)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			r.e.Stats().ReloadFailures.Add(1)
			r.log.Error("pgtraffic: rules file unreadable; keeping the last good rules", "path", w.path, "error", err)
		}
		return nil, false
	}
	return data, true
}

// apply puts data in force if it differs from the last attempt and is valid.
func (w *watcher) apply(r *Runtime, data []byte) {
	sum := sha256.Sum256(data)
	if sum == w.last {
		return
	}
	w.last = sum
	cfg, err := rules.Parse(data)
	if err == nil {
		err = r.SetConfig(cfg)
	}
	if err != nil {
		r.e.Stats().ReloadFailures.Add(1)
		r.log.Error("pgtraffic: invalid rules file; keeping the last good rules", "path", w.path, "error", err)
		return
	}
	r.log.Info("pgtraffic: rules reloaded", "path", w.path, "budgets", len(cfg.Budgets), "rules", len(cfg.Rules))
}

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
