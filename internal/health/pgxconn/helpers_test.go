package pgxconn_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
)

// logBuffer captures a logger's output for assertions; safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex // protects buf
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// count returns how many logged lines contain sub.
func (l *logBuffer) count(sub string) int {
	n := 0
	for line := range strings.Lines(l.String()) {
		if strings.Contains(line, sub) {
			n++
		}
	}
	return n
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func newLogger() (*slog.Logger, *logBuffer) {
	b := &logBuffer{}
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}
