package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

const probeRules = `
budgets:
  - {name: b, mode: enforce, server_share: 1, burst_limit: 2s, max_wait: 5s}
  - {name: nowait, mode: enforce, server_share: 1, burst_limit: 2s}
  - {name: short, mode: enforce, server_share: 1, burst_limit: 2s, max_wait: 1s}
  - {name: slots, mode: enforce, max_concurrent: 10}
rules:
  - {budget: b, match: {app: rate}}
  - {budget: nowait, match: {app: nowait}}
  - {budget: short, match: {app: short}}
  - {budget: slots, match: {app: slots}}
`

// beginAsync begins q on another goroutine; the channel receives its Exec or error.
type begun struct {
	x   *Exec
	err error
}

func beginAsync(e *Engine, ctx context.Context, q string) <-chan begun {
	ch := make(chan begun, 1)
	go func() {
		x, err := begin(e, ctx, q)
		ch <- begun{x, err}
	}()
	return ch
}

// TestUntrainedPatternRunsOneAtATime: while a pattern has never run, its second statement
// waits for the first (the probe) and is then predicted from the probe's execution; once the
// pattern is trained, its statements do not wait for one another.
func TestUntrainedPatternRunsOneAtATime(t *testing.T) {
	e, clk := newEngine(t, probeRules)
	ctx := tagging.With(context.Background(), "app", "rate")
	const q = "select pg_sleep(0.05)"
	first, err := begin(e, ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if first.Predicted != 0 {
		t.Fatalf("an untrained pattern without a plan cost is predicted %v, want 0", first.Predicted)
	}
	second := beginAsync(e, ctx, q)
	<-clk.waiting // the second waits for the probe (bounded by a timer)
	select {
	case b := <-second:
		t.Fatalf("the second statement of an untrained pattern ran beside its probe: %+v", b)
	default:
	}
	clk.advance(50 * time.Millisecond)
	first.Finish(ctx, nil)
	b := <-second
	if b.err != nil {
		t.Fatal(b.err)
	}
	if b.x.Predicted < 0.05-1e-9 {
		t.Fatalf("after the probe the statement is predicted %v, want the probe's 0.05", b.x.Predicted)
	}
	// Trained: two at once, no wait.
	third, err := begin(e, ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	b.x.Finish(ctx, nil)
	third.Finish(ctx, nil)
}

// TestProbeWithoutMaxWaitRefuses: without max_wait the second statement of an untrained
// pattern is refused while the probe runs, told to retry when the probe has run about twice
// as long; after the probe it is admitted at the probe's cost.
func TestProbeWithoutMaxWaitRefuses(t *testing.T) {
	e, clk := newEngine(t, probeRules)
	ctx := tagging.With(context.Background(), "app", "nowait")
	const q = "select pg_sleep(0.05)"
	first, err := begin(e, ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	_, err = begin(e, ctx, q)
	d := denial(t, err)
	if d.Reason != ReasonBudget || d.Limit != limitProbe || d.RetryAfter != minRetry || d.Budget != "nowait" {
		t.Fatalf("beside the probe: %+v, want a budget denial naming the probe, retry after %v", d, minRetry)
	}
	clk.advance(30 * time.Millisecond)
	if _, err := begin(e, ctx, q); denial(t, err).RetryAfter != 30*time.Millisecond {
		t.Fatalf("the retry hint must grow with the probe's run: %v", err)
	}
	clk.advance(20 * time.Millisecond)
	first.Finish(ctx, nil)
	x, err := begin(e, ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Finish(ctx, nil)
	if x.Predicted < 0.05-1e-9 {
		t.Fatalf("after the probe: predicted %v, want 0.05", x.Predicted)
	}
}

// TestProbeWaitWithinMaxWait: a max_wait shorter than the probe's bound ends the wait with
// a refusal.
func TestProbeWaitWithinMaxWait(t *testing.T) {
	e, clk := newEngine(t, probeRules)
	ctx := tagging.With(context.Background(), "app", "short")
	const q = "select pg_sleep(10)"
	probe, err := begin(e, ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Finish(ctx, nil)
	second := beginAsync(e, ctx, q)
	<-clk.waiting
	clk.advance(time.Second)
	b := <-second
	if d := denial(t, b.err); d.Limit != limitProbe {
		t.Fatalf("after max_wait: %+v, want the probe denial", d)
	}
}

// TestHungProbeDelaysAtMostTheBurst: a probe that does not end holds the others back for at
// most the budget's burst_limit, after which they are charged at least what it has run.
func TestHungProbeDelaysAtMostTheBurst(t *testing.T) {
	e, clk := newEngine(t, probeRules)
	ctx := tagging.With(context.Background(), "app", "rate")
	const q = "select pg_sleep(100)"
	hung, err := begin(e, ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Finish(ctx, nil)
	second := beginAsync(e, ctx, q)
	<-clk.waiting
	clk.advance(2*time.Second - time.Millisecond)
	select {
	case b := <-second:
		t.Fatalf("admitted before the burst_limit passed: %+v", b)
	default:
	}
	clk.advance(time.Millisecond)
	b := <-second
	if b.err != nil {
		t.Fatal(b.err)
	}
	defer b.x.Finish(ctx, nil)
	if b.x.Predicted < 2 {
		t.Fatalf("charged %v, want at least the 2s the probe has run", b.x.Predicted)
	}
}

// TestProbeWaitEndsWithContext: a statement waiting for a probe returns when its context
// ends; a budget without a bucket has no probe at all.
func TestProbeWaitEndsWithContext(t *testing.T) {
	e, clk := newEngine(t, probeRules)
	ctx := tagging.With(context.Background(), "app", "rate")
	const q = "select pg_sleep(1)"
	probe, err := begin(e, ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Finish(ctx, nil)
	cctx, cancel := context.WithCancel(ctx)
	second := beginAsync(e, cctx, q)
	<-clk.waiting
	cancel()
	if b := <-second; !errors.Is(b.err, context.Canceled) {
		t.Fatalf("got %+v, want context.Canceled", b)
	}

	slots := tagging.With(context.Background(), "app", "slots")
	const q2 = "select pg_sleep(2)"
	for range 3 {
		x, err := begin(e, slots, q2)
		if err != nil {
			t.Fatal(err)
		}
		defer x.Finish(slots, nil)
	}
}

// TestRefusedProbeHandsOver: a probe refused by its budget is no probe: the next statement
// of the pattern becomes one at once.
func TestRefusedProbeHandsOver(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: b, mode: enforce, server_share: 1, burst_limit: 2s, max_concurrent: 1}
rules:
  - {budget: b, match: {app: rate}}
`)
	ctx := tagging.With(context.Background(), "app", "rate")
	other, err := begin(e, ctx, "select 1") // holds the only slot
	if err != nil {
		t.Fatal(err)
	}
	const q = "select pg_sleep(1)"
	if _, err := begin(e, ctx, q); err == nil || denial(t, err).Reason != ReasonConcurrency {
		t.Fatalf("got %v, want a concurrency denial", err)
	}
	other.Finish(ctx, nil)
	x, err := begin(e, ctx, q) // would hang on the fake clock if the refused probe still ran
	if err != nil {
		t.Fatal(err)
	}
	x.Finish(ctx, nil)
}
