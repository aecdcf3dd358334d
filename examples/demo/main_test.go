package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
)

// The walkthrough tells its story without a DEBUG line per statement; -v turns them on, and
// warnings (the blocks it shows) are logged either way.
func TestNewLogger(t *testing.T) {
	for _, tc := range []struct {
		name      string
		verbose   bool
		wantDebug bool
	}{
		{"default", false, false},
		{"verbose", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			l := newLogger(&buf, tc.verbose)
			if got := l.Enabled(context.Background(), slog.LevelDebug); got != tc.wantDebug {
				t.Errorf("debug enabled = %v, want %v", got, tc.wantDebug)
			}
			l.Debug("pgtraffic: statement", "fingerprint", "f00")
			l.Warn("pgtraffic: statement blocked")
			out := buf.String()
			if got := strings.Contains(out, "level=DEBUG"); got != tc.wantDebug {
				t.Errorf("DEBUG line logged = %v, want %v; output:\n%s", got, tc.wantDebug, out)
			}
			if !strings.Contains(out, "level=WARN") {
				t.Errorf("warning not logged; output:\n%s", out)
			}
			if strings.Contains(out, "time=") {
				t.Errorf("timestamp logged; output:\n%s", out)
			}
		})
	}
}
