package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// failingConn is an EXPLAIN that the server answers with err.
type failingConn struct{ err error }

func (c failingConn) Explain(context.Context, string, []any) (cost.Plan, error) {
	return cost.Plan{}, c.err
}

// TestExplainCancelledAnswersTheStatement: an EXPLAIN the server cancelled (the session's
// lock_timeout or statement_timeout) answers its statement with that error, which the
// statement would meet again if sent: the caller does not wait out its own limit twice. Any
// other failure of the EXPLAIN falls back to the pattern's history, and the statement runs.
func TestExplainCancelledAnswersTheStatement(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: b, mode: enforce, server_share: 0.5}
rules:
  - {budget: b, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	server := errors.New("ERROR: canceling statement due to lock timeout (SQLSTATE 55P03)")
	cancelled := failingConn{fmt.Errorf("%w: %w", cost.ErrCancelled, server)}
	_, err := e.Begin(ctx, new(Exec), cancelled, "select * from t where a > $1", []any{1})
	if !errors.Is(err, server) {
		t.Fatalf("a statement whose EXPLAIN the server cancelled: %v, want the server's error", err)
	}
	if n := e.InFlight(); n != 0 {
		t.Errorf("%d in flight after the answer, want 0", n)
	}
	if s := e.Stats(); s.ExplainCalls.Load() != 1 || s.ExplainFailures.Load() != 1 {
		t.Errorf("explain calls %d, failures %d; want 1 and 1", s.ExplainCalls.Load(), s.ExplainFailures.Load())
	}

	x := new(Exec)
	ctx2, err := e.Begin(ctx, x, failingConn{errors.New("cost: explain failed: SQLSTATE 42501")}, "select * from u where a > $1", []any{1})
	if err != nil {
		t.Fatalf("a statement whose EXPLAIN failed otherwise: %v, want it sent (the fallback)", err)
	}
	x.Finish(ctx2, nil)
}

// blockedConn is an EXPLAIN that waits for a lock until its context ends.
type blockedConn struct{}

func (blockedConn) Explain(ctx context.Context, _ string, _ []any) (cost.Plan, error) {
	<-ctx.Done()
	return cost.Plan{}, fmt.Errorf("cost: explain failed: %w", ctx.Err())
}

// overrunObserver counts what the telemetry counts as max_duration blocks: Decision's, and
// Blocked's of a statement marked blocked that no Denial refused (telemetry.Blocked).
type overrunObserver struct {
	recObserver
	decided, blocked int
}

func (o *overrunObserver) Decision(budget, decision, reason string) {
	if decision == DecisionBlock && reason == "max_duration" {
		o.decided++
	}
}

func (o *overrunObserver) Blocked(_ context.Context, x *Exec, err error) {
	var d *Denial
	if !errors.As(err, &d) && x.Decision == DecisionBlock && x.Reason == "max_duration" {
		o.blocked++
	}
}

// TestExplainBoundedByMaxDuration: the EXPLAIN that prices a new pattern runs under its
// budget's max_duration, as the statement would: one that waits past it (a lock) answers the
// statement with an error matching ErrOverrun and context.DeadlineExceeded, counted as the
// budget's block, reason max_duration, once, by the budget and by the observer; nothing is
// left in flight.
func TestExplainBoundedByMaxDuration(t *testing.T) {
	obs := &overrunObserver{}
	e, _ := newEngine(t, `
budgets:
  - {name: b, mode: enforce, server_share: 0.5, max_duration: 20ms}
rules:
  - {budget: b, match: {app: x}}
`, func(o *Options) { o.Observer = obs })
	ctx := tagging.With(context.Background(), "app", "x")
	_, err := e.Begin(ctx, new(Exec), blockedConn{}, "select * from t where a > $1", []any{1})
	if !errors.Is(err, ErrOverrun) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a statement whose EXPLAIN waited past max_duration: %v, want ErrOverrun and context.DeadlineExceeded", err)
	}
	if n := e.InFlight(); n != 0 {
		t.Errorf("%d in flight after the answer, want 0", n)
	}
	if s := e.Stats(); s.ExplainCalls.Load() != 1 || s.ExplainFailures.Load() != 1 {
		t.Errorf("explain calls %d, failures %d; want 1 and 1", s.ExplainCalls.Load(), s.ExplainFailures.Load())
	}
	if d := e.Budgets()[0].Decisions; d.Blocked != 1 || d.BlockedBy["max_duration"] != 1 {
		t.Errorf("budget b counted %d blocks (%v), want 1, reason max_duration", d.Blocked, d.BlockedBy)
	}
	if obs.decided+obs.blocked != 1 {
		t.Errorf("the observer was told of %d max_duration blocks by Decision and %d by Blocked, want 1 in all",
			obs.decided, obs.blocked)
	}
}

func (failingConn) InTransaction() bool { return false }

func (blockedConn) InTransaction() bool { return false }
