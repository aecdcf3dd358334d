package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/engine"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newRuntime is a runtime and its engine on a fake clock, with rulesText in force when it is
// not empty; o adjusts the engine's options (its clock and logger are the runtime's).
func newRuntime(t testing.TB, rulesText string, o ...func(*engine.Options)) (*Runtime, *fakeclock.Clock) {
	t.Helper()
	clk := fakeclock.New()
	opts := engine.Options{Logger: quiet, Now: clk.Now, After: clk.After}
	for _, f := range o {
		f(&opts)
	}
	r := New(engine.New(opts), Options{})
	t.Cleanup(func() { r.Close() })
	if rulesText != "" {
		cfg, err := rules.Parse([]byte(rulesText))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.SetConfig(cfg); err != nil {
			t.Fatal(err)
		}
	}
	return r, clk
}

// begin begins q in e (no connection: no EXPLAIN).
func begin(e *engine.Engine, ctx context.Context, q string) (*engine.Exec, error) {
	x := new(engine.Exec)
	if _, err := e.Begin(ctx, x, nil, q, nil); err != nil {
		return nil, err
	}
	return x, nil
}

// run begins q in e and, if admitted, finishes it after d of fake time.
func run(e *engine.Engine, clk *fakeclock.Clock, ctx context.Context, q string, d time.Duration) error {
	x, err := begin(e, ctx, q)
	if err != nil {
		return err
	}
	clk.Advance(d)
	x.Finish(ctx, nil)
	return nil
}

// overrun begins q and finishes it as cancelled past a max_duration of 300ms.
func overrun(t *testing.T, e *engine.Engine, clk *fakeclock.Clock, ctx context.Context, q string) {
	t.Helper()
	x, err := begin(e, ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(300 * time.Millisecond)
	x.Finish(ctx, fmt.Errorf("timeout: %w", engine.ErrOverrun))
}

func denial(t *testing.T, err error) *engine.Denial {
	t.Helper()
	var d *engine.Denial
	if !errors.As(err, &d) {
		t.Fatalf("want a *engine.Denial, got %v", err)
	}
	return d
}

// deadRedis is a redis:// URL that nothing listens on: the coordinator runs in fallback.
func deadRedis(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "redis://" + l.Addr().String() + "/0"
}
