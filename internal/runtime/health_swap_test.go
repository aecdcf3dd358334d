package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/engine"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
	"github.com/pgtraffic/pgtraffic/internal/health"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// knobConn is a health connection whose every read returns 10.
type knobConn struct{ closed atomic.Bool }

func (c *knobConn) Exec(context.Context, string, ...any) error          { return nil }
func (c *knobConn) ReadNumber(context.Context, string) (float64, error) { return 10, nil }
func (c *knobConn) IsClosed() bool                                      { return c.closed.Load() }
func (c *knobConn) Close(context.Context) error                         { c.closed.Store(true); return nil }

// TestHealthIntervalReloadNeverAdmitsThrottled: a batch budget is throttled on a fresh
// sample (custom.knob reads 10, its threshold is 5). A reload that changes only health_interval
// replaces the sampler; the CHANGELOG promises that such a reload carries the last sample over,
// so that throttling "neither lifts nor starts" until the new sampler reads. Statements keep
// arriving while the reload runs (here each time the reload reads the clock, a job asks Check,
// as a concurrent one would at that instant): none of them may be admitted, since nothing
// about the server changed. The runtime builds the new sampler before it hands it to the
// engine in the old one's place: were the engine left with no sampler meanwhile, a budget whose
// thresholds need one would admit everything in that moment, long enough under load for real
// statements to slip through.
func TestHealthIntervalReloadNeverAdmitsThrottled(t *testing.T) {
	const text = `
health_interval: %s
health_queries: {knob: "select v from knob"}
budgets:
  - {name: batch, mode: enforce, throttle_when: {custom.knob: 5}}
rules:
  - {budget: batch, match: {job: import}}
`
	clk := fakeclock.New()
	ctx := tagging.With(context.Background(), "job", "import")
	var e *engine.Engine
	var armed, inside atomic.Bool
	var asked, admitted atomic.Int64
	now := func() time.Time {
		if armed.Load() && inside.CompareAndSwap(false, true) {
			asked.Add(1)
			if e.Check(ctx) == nil {
				admitted.Add(1)
			}
			inside.Store(false)
		}
		return clk.Now()
	}
	e = engine.New(engine.Options{Logger: quiet, Now: now, After: clk.After})
	r := New(e, Options{HealthConnect: func(context.Context) (health.Conn, error) { return &knobConn{}, nil }})
	t.Cleanup(func() { r.Close() })
	set := func(interval string) {
		t.Helper()
		cfg, err := rules.Parse([]byte(fmt.Sprintf(text, interval)))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.SetConfig(cfg); err != nil {
			t.Fatal(err)
		}
	}
	set("500ms")
	deadline := time.Now().Add(10 * time.Second)
	for {
		var d *engine.Denial
		if err := e.Check(ctx); errors.As(err, &d) && d.Reason == vocab.ReasonHealth && d.Limit == "custom.knob=10, threshold 5" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the batch is not throttled on custom.knob=10: Check = %v", e.Check(ctx))
		}
		time.Sleep(5 * time.Millisecond)
	}

	armed.Store(true)
	set("600ms")
	armed.Store(false)
	if asked.Load() == 0 {
		t.Fatal("no Check ran during the reload")
	}
	if n := admitted.Load(); n > 0 {
		t.Errorf("during a reload that changed only health_interval, Check admitted the throttled batch %d of %d times; "+
			"custom.knob is still 10 >= 5: want it refused throughout", n, asked.Load())
	}
	if err := e.Check(ctx); err == nil {
		t.Errorf("after the reload Check = nil; want the batch still throttled")
	}
}
