package engine

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/pgtraffic/pgtraffic/driver/rules"
)

// LoadFile reads, parses and puts in force the rules file at path.
func (e *Engine) LoadFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("pgtraffic: rules file: %w", err)
	}
	cfg, err := rules.Parse(data)
	if err != nil {
		return fmt.Errorf("pgtraffic: rules file %s: %w", path, err)
	}
	return e.SetConfig(cfg)
}

// WatchFile loads the rules file at path and keeps watching it: a valid change is in force
// before the next statement, an invalid one is logged and counted and the last good rules stay.
//
// It watches the file's directory, not the file, so that editors' atomic renames and Kubernetes
// ConfigMap updates (a symlink swap of "..data") are seen: any event in the directory re-reads
// the file, and a content change is applied.
func (e *Engine) WatchFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("pgtraffic: rules file: %w", err)
	}
	cfg, err := rules.Parse(data)
	if err != nil {
		return fmt.Errorf("pgtraffic: rules file %s: %w", path, err)
	}
	if err := e.SetConfig(cfg); err != nil {
		return fmt.Errorf("pgtraffic: rules file %s: %w", path, err)
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("pgtraffic: watching rules file: %w", err)
	}
	if err := fw.Add(filepath.Dir(path)); err != nil {
		fw.Close()
		return fmt.Errorf("pgtraffic: watching rules file: %w", err)
	}
	w := &watcher{fw: fw, path: path, last: data, done: make(chan struct{})}
	e.mu.Lock()
	if e.watcher != nil {
		e.mu.Unlock()
		fw.Close()
		return fmt.Errorf("pgtraffic: a rules file is already watched")
	}
	e.watcher = w
	e.mu.Unlock()
	go w.run(e)
	return nil
}

type watcher struct {
	fw   *fsnotify.Watcher
	path string
	done chan struct{}
	once sync.Once

	last []byte // content of the last reload attempt; only run touches it
}

func (w *watcher) close() error {
	var err error
	w.once.Do(func() {
		err = w.fw.Close()
		<-w.done
	})
	return err
}

// settle is how long the watcher lets a burst of events (write, chmod, rename) finish before it
// reads the file, so that it does not parse a half-written file. Well within the 1 s promise.
const settle = 50 * time.Millisecond

func (w *watcher) run(e *Engine) {
	defer close(w.done)
	var timer <-chan time.Time
	for {
		select {
		case _, ok := <-w.fw.Events:
			if !ok {
				return
			}
			timer = time.After(settle)
		case err, ok := <-w.fw.Errors:
			if !ok {
				return
			}
			e.log.Error("pgtraffic: rules file watcher", "path", w.path, "error", err)
		case <-timer:
			timer = nil
			w.reload(e)
		}
	}
}

func (w *watcher) reload(e *Engine) {
	data, err := os.ReadFile(w.path)
	if err != nil {
		if os.IsNotExist(err) {
			return // mid-swap, or removed: keep the rules in force; the next event re-reads
		}
		e.stats.ReloadFailures.Add(1)
		e.log.Error("pgtraffic: rules file unreadable; keeping the last good rules", "path", w.path, "error", err)
		return
	}
	if bytes.Equal(data, w.last) {
		return
	}
	w.last = data
	cfg, err := rules.Parse(data)
	if err == nil {
		err = e.SetConfig(cfg)
	}
	if err != nil {
		e.stats.ReloadFailures.Add(1)
		e.log.Error("pgtraffic: invalid rules file; keeping the last good rules", "path", w.path, "error", err)
		return
	}
	e.log.Info("pgtraffic: rules reloaded", "path", w.path, "budgets", len(cfg.Budgets), "rules", len(cfg.Rules))
}
