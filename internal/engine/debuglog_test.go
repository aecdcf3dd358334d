package engine

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/internal/bounded"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestDebugLogBoundsTags: the debug log of a statement shows its tags cut and made valid UTF-8
// as its span's attributes are: a context tag is the application's, of any size and bytes.
func TestDebugLogBoundsTags(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e, _ := newEngine(t, "", func(o *Options) { o.Logger = log })
	huge := strings.Repeat("v", 100_000) + "\xff"
	ctx := tagging.With(context.Background(), "tenant", huge)
	x, err := begin(e, ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	x.Finish(ctx, nil)
	line := buf.String()
	if !strings.Contains(line, "tags.tenant="+strings.Repeat("v", bounded.ValueLen)) {
		t.Fatalf("no tenant tag in the debug log: %.300q", line)
	}
	if strings.Contains(line, strings.Repeat("v", bounded.ValueLen+1)) || len(line) > 4096 {
		t.Fatalf("a debug log line of %d bytes: the tag was not cut to %d bytes", len(line), bounded.ValueLen)
	}
}
