package engine

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestThresholdWarningLogLine: a limit past its warning_threshold is logged as such in either
// mode, not as a warn budget's would-be refusal ("warn mode: it runs"), which an enforce
// budget's log must never say.
func TestThresholdWarningLogLine(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	e, _ := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 2, warning_threshold: 0.5}
rules:
  - {budget: a, match: {app: x}}
`, func(o *Options) { o.Logger = log })
	ctx := tagging.With(context.Background(), "app", "x")
	x, err := begin(e, ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	defer x.Finish(ctx, nil)
	out := buf.String()
	if !strings.Contains(out, thresholdMessage) || strings.Contains(out, "warn mode") {
		t.Errorf("an enforce budget's slot at its warning_threshold logged %q, want %q", out, thresholdMessage)
	}
}
